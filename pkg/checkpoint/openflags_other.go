//go:build !unix

package checkpoint

// No FIFOs to guard against here; os.Root still refuses escapes.
const (
	oNonblock  = 0
	oDirectory = 0
	oNoFollow  = 0
)
