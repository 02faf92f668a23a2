// Package memtrim releases the pages of the executable that only start-up
// touched. A Go binary maps its code and read-only data from the file;
// every package's init (about 300 of them, most linked for the cloud SDKs'
// other paths) faults pages in, 64 KiB of them at a time (the kernel's
// fault-around), so at idle about 21 MiB of a 34 MB binary stays mapped
// (RssFile) although the idle loop runs a small part of it. Releasing them
// once start-up is over leaves mapped what the agent uses from then on:
// what it touches again faults back in from the page cache (a minor fault,
// no disk read while the cache holds it).
//
// Only the executable's read-only, file-backed mappings are released
// (MADV_DONTNEED on a private mapping never written to re-reads the same
// bytes); its writable data, the heap and stacks are never touched.
package memtrim

// Released is what Release unmapped: its size, and its resident part
// before (what RSS lost).
type Released struct {
	Mapped, Resident int64 // bytes
}
