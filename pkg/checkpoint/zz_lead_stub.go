package checkpoint

// TEMPORARY (lead): replaced by the storage helper's parts.go at merge.
type PartSpec struct {
	Node      string
	Ranks     []int
	WorldSize int
}
