package a

// Owner has behaviour: writes from outside count against the owners' target.
type Owner struct{ X int }

func (o *Owner) Bump() { o.X++ } // its own package: not counted

// Value is plain data.
type Value struct{ Y []int }

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
