package b

import "github.com/spotagent/spotagent/a"

func Touch(o *a.Owner, v a.Value, c *a.RunConfig) a.Value {
	o.X = 1              // counted, an owner
	o.X++                // counted, an owner
	v.Y[0] = 2           // counted, a value
	c.Z = 3              // exempt: config
	w := a.Value{Y: nil} // construction
	_ = w
	return v
}
