package b

import "github.com/spotagent/spotagent/a"

func Touch(o *a.Owner, g *a.Guarded, out *a.Outer, v a.Value, c *a.RunConfig) a.Value {
	o.X = 1              // counted, an owner
	o.X++                // counted, an owner
	g.W = 2              // counted, an owner (unexported state)
	out.X = 3            // counted, Owner's field promoted through Outer
	v.Y[0] = 2           // listed, a value
	c.Z = 3              // exempt: config
	w := a.Value{Y: nil} // construction
	_ = w
	return v
}
