package cloud

import "os"

// A FileSource is a reader over a whole regular file, handed to Put. A
// store that can send straight from the file, by positioned reads, without
// copying it through Read into buffers of its own (the S3 store: no part
// buffers, one copy less per byte), may do so instead of calling Read; it
// then calls Sent with what it uploaded, and the checksum the server
// verified. A store that does not know the interface just reads it.
type FileSource interface {
	Read(p []byte) (int, error)
	// SourceFile is the file the reader reads from its start, and the size
	// Put was given.
	SourceFile() (*os.File, int64)
	// Sent records that the store uploaded the file's first n bytes, whose
	// CRC32C (Castagnoli) is crc32c, and checked that nothing follows them.
	Sent(n int64, crc32c uint32)
}

// A ProgressSource is a FileSource that wants to know, during a long
// upload, how far the store has got: the store calls Progress with each
// further run of bytes sent (the S3 store after each part, the GCS store as
// the request body is read), concurrently from its part uploads, so that a
// 2 GiB upload's progress moves at a steady pace rather than jumping to
// 100 % at Sent. Sent still reports the whole file; the source counts what
// Progress had not.
type ProgressSource interface {
	FileSource
	Progress(n int64)
}

// ReportProgress calls src's Progress with n when it has one.
func ReportProgress(src FileSource, n int64) {
	if p, ok := src.(ProgressSource); ok && n > 0 {
		p.Progress(n)
	}
}

// A ScannedSource is a FileSource that also wants the bytes a store reads
// to checksum the file before sending it (the S3 and GCS stores do): the
// committer takes its digest (pkg/checkpoint, manifest.go) in that same
// pass. Scanned gets the file's bytes in order from its start, each byte
// once, before Sent; a store that reads a file again (a retry) reports
// only the first read. A source that got fewer than Sent's n bytes reads
// the file once more itself.
type ScannedSource interface {
	FileSource
	Scanned(p []byte)
}

// ReportScanned calls src's Scanned with p when it has one.
func ReportScanned(src FileSource, p []byte) {
	if s, ok := src.(ScannedSource); ok && len(p) > 0 {
		s.Scanned(p)
	}
}
