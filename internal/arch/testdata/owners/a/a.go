package a

// Owner keeps state of its own (an unexported field): writes from
// outside into its exported fields count against the target.
type Owner struct {
	X int
	n int
}

func (o *Owner) Bump() { o.X++; o.n++ } // its own package: not counted

// Guarded is an owner without methods: its unexported field is its own.
type Guarded struct {
	W    int
	seen bool
}

// Value is plain data, every field exported; a setter is a convenience.
type Value struct{ Y []int }

func (v *Value) Set(i int) { v.Y[0] = i }

// Outer embeds an owner: a write to its promoted field is the owner's.
type Outer struct{ Owner }

// RunConfig is wiring: exempt.
type RunConfig struct{ Z int }

// Wide is a callback interface over 8 methods.
type Wide interface {
	M1()
	M2()
	M3()
	M4()
	M5()
	M6()
	M7()
	M8()
	M9()
}
