//go:build !unix

package checkpoint

// No FIFOs to guard against here; os.Root still refuses escapes.
const (
	ONonblock  = 0
	oDirectory = 0
	ONoFollow  = 0
)
