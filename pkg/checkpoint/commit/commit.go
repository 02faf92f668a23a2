// Package commit uploads checkpoint directories to a store and commits
// them: data objects first, then the manifest, then latest.json. A job
// checkpoint's parts are assembled into one manifest by whichever node
// sees them complete (parts.go); a Pipeline uploads files before the
// checkpoint is done; a Gate orders the uploads of several runs (node
// mode).
package commit

// The Committer's one commit: a checkpoint directory's files uploaded
// (each read once for its CRC32C and BLAKE3 digest while it is sent), then
// the manifest, then latest.json.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// Committer uploads checkpoint directories to a store: data objects first,
// then the manifest, then latest.json. A checkpoint whose manifest is not
// written was never committed, whatever objects it left behind.
type Committer struct {
	Store       cloud.Store
	RunID       string
	Source      checkpoint.Machine
	Concurrency int // files uploaded at once; default 4
	// Gate, when set, is shared with other runs' committers (node mode):
	// a commit waits there for a slot, the most urgent first.
	Gate *Gate
	Log  *zap.Logger
	// Lease, when set, fences this committer: manifests record its epoch
	// and latest.json only moves while no newer session exists (the lease, pkg/checkpoint latest.go).
	Lease *checkpoint.Lease
	// PartLease, when set, fences this node's parts of job checkpoints
	// (AcquirePartLease): no part is written once a newer copy of the
	// node took a lease.
	PartLease *checkpoint.Lease
	// Session, when set, is a folder of its own for this session's part
	// data (checkpoints/<dir>/<node>/<session>/...): two live copies of
	// one node never write, or delete, each other's objects.
	Session string

	// pace: early uploads or not (pace.go), created once by paceState
	// and shared with OnStore's committers.
	paceOnce sync.Once
	pace     *earlyPace
}

// Fence fences c by a session's lease (Lease): taken after c is made, at
// the session's start, before its first commit.
func (c *Committer) Fence(l *checkpoint.Lease) { c.Lease = l }

// FenceParts fences c's parts of job checkpoints by this node's lease
// (PartLease).
func (c *Committer) FenceParts(l *checkpoint.Lease) { c.PartLease = l }

// OnStore is a committer like c that writes to st (a store that checks
// each file before the manifest, zero-code mode's), sharing c's pace.
func (c *Committer) OnStore(st cloud.Store) *Committer {
	return &Committer{Store: st, RunID: c.RunID, Source: c.Source, Concurrency: c.Concurrency, Gate: c.Gate, Log: c.Log,
		Lease: c.Lease, PartLease: c.PartLease, Session: c.Session, pace: c.paceState()}
}

// SessionParts gives this session's part data a folder of its own
// (Session).
func (c *Committer) SessionParts(session string) { c.Session = session }

// Request names one checkpoint directory to commit.
type Request struct {
	Dir string
	// Root, when set, is Dir opened by the caller, which keeps and closes
	// it: the commit scans and reads through it only, so renaming or
	// swapping Dir meanwhile changes nothing. Without it, Commit opens Dir.
	Root     *os.Root
	ID       string
	Step     int64
	Reason   string
	Metadata json.RawMessage
	Urgent   bool // an interruption or shutdown checkpoint: first through the Gate
	// Pipeline, when set, holds files uploaded before done (`saved`):
	// those still unchanged are not uploaded again (pipeline.go). With
	// Part, it must come from NewPartPipeline.
	Pipeline *Pipeline
	// Part, when set, makes this one node's part of a job checkpoint
	// (parts.go): Commit uploads it, then waits until every part of the
	// job is durable and commits the job manifest. nil: a single-node
	// checkpoint.
	Part *checkpoint.PartSpec
	// Owners, when set, are the uids of the trainers that wrote Dir, of
	// another user than the agent's (node and sidecar modes, an agent
	// running as root): every file read for the commit must be one of
	// theirs with a single link (checkpoint.CheckOwnedBy), or the commit
	// fails with checkpoint.ErrNotOwned. nil: no such rule.
	Owners []int
}

// Result describes a committed checkpoint.
type Result struct {
	Manifest    *checkpoint.Manifest
	ManifestKey string
	Bytes       int64         // the checkpoint's size; with Request.Part, this part's
	Upload      time.Duration // data objects only, from the upload slot on
	Total       time.Duration // scan to latest.json
}

// Commit uploads req.Dir and commits it. On error nothing of this
// checkpoint is committed and latest.json is unchanged.
func (c *Committer) Commit(ctx context.Context, req Request) (_ *Result, err error) {
	start := time.Now()
	log := c.log().With(zap.String("id", req.ID), zap.Int64("step", req.Step))
	prefix, err := c.prefixOf(req)
	if err != nil {
		return nil, err
	}
	root := req.Root
	if root == nil {
		if root, err = checkpoint.OpenLocalDir(req.Dir); err != nil {
			return nil, fmt.Errorf("commit: %w", err)
		}
		defer root.Close()
	}
	files, err := checkpoint.Scan(root)
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	// Files uploaded early and unchanged since are not uploaded again.
	var piped map[string]checkpoint.File
	var pipeStart time.Time
	if req.Pipeline != nil {
		if piped, pipeStart, err = req.Pipeline.take(ctx, files); err != nil {
			return nil, fmt.Errorf("commit: %w", err)
		}
	}
	total, todo := notPiped(files, piped)
	outer, unslot := ctx, func() {}
	if c.Gate != nil {
		gctx, release, serr := c.slot(ctx, log, req, total, start)
		if serr != nil {
			return nil, serr
		}
		defer release()
		unslot = release
		ctx = gctx
		defer func() { err = preempted(gctx, err) }()
	}
	upStart := time.Now() // the throughput estimate must not count the wait
	m := c.manifest(req, start, files, piped)
	if !pipeStart.IsZero() && pipeStart.Before(upStart) {
		upStart = pipeStart // throughput: the early uploads count too
	}
	if err := c.upload(ctx, log, root, req.Owners, prefix, files, todo, total, m.Files); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	uploaded := time.Now()
	if req.Pipeline != nil {
		req.Pipeline.score(m.Bytes(), uploaded)
	}
	key := checkpoint.ManifestKey(req.Step, req.ID)
	if req.Part != nil {
		// The part's data is durable. Waiting for the other nodes frees
		// the upload slot, and only the caller's ctx bounds it.
		ctx = outer
		if m, err = c.commitPart(ctx, log, req, m, unslot); err != nil {
			return nil, fmt.Errorf("commit: %w", err)
		}
	} else if err := c.commitSingle(ctx, req, m); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := c.publish(ctx, checkpoint.Latest{Manifest: key, Step: m.Step, ID: m.ID}); err != nil {
		// The manifest is durable: restore lists the manifests newer
		// than latest.json's and still finds this checkpoint. Report
		// the failure all the same.
		return nil, fmt.Errorf("commit: %w", err)
	}
	bytes := m.Bytes()
	if req.Part != nil {
		bytes = m.PartBytes(req.Part.Node)
	}
	res := &Result{Manifest: m, ManifestKey: key, Bytes: bytes, Upload: uploaded.Sub(upStart), Total: time.Since(start)}
	// upload_s counts from the first early upload, which may precede this
	// call: total_s, from whichever began first, is the whole of which
	// upload_s and commit_s (this call, scan to latest.json) are parts.
	first := start
	if upStart.Before(first) {
		first = upStart
	}
	log.Info("checkpoint committed", zap.String("uri", c.Store.URI(key)), zap.Int("files", len(files)), zap.Int("early", len(piped)),
		zap.Int64("bytes", res.Bytes), zap.Float64("upload_s", seconds(res.Upload)), zap.Float64("commit_s", seconds(res.Total)),
		zap.Float64("total_s", seconds(time.Since(first))))
	return res, nil
}

// prefixOf checks req and returns the store prefix of its data objects:
// the checkpoint's, or with req.Part this committer's part's.
func (c *Committer) prefixOf(req Request) (string, error) {
	if !checkpoint.ValidID(req.ID) {
		return "", fmt.Errorf("commit: bad checkpoint id %q", req.ID)
	}
	if req.Step < 0 {
		return "", fmt.Errorf("commit: negative step %d", req.Step)
	}
	if len(req.Metadata) > 0 && !json.Valid(req.Metadata) {
		return "", errors.New("commit: metadata is not valid json")
	}
	if req.Part == nil {
		return checkpoint.Prefix(req.Step, req.ID), nil
	}
	if err := req.Part.Validate(); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	if req.Pipeline != nil && !pipelineFits(req.Pipeline, req.ID, req.Part) {
		return "", errors.New("commit: the pipeline does not upload under this part (NewPartPipeline)")
	}
	return c.partPrefix(req.Step, req.ID, req.Part.Node), nil
}

// notPiped returns the files (their indexes) that piped does not hold,
// and their bytes: what the commit uploads.
func notPiped(files []checkpoint.LocalFile, piped map[string]checkpoint.File) (int64, []int) {
	var total int64
	var todo []int
	for i, f := range files {
		if _, ok := piped[f.Rel]; !ok {
			total += f.Size
			todo = append(todo, i)
		}
	}
	return total, todo
}

// slot waits at the Gate for an upload slot for total bytes; it returns
// the context the upload runs under (a more urgent commit may preempt it)
// and the func that frees the slot.
func (c *Committer) slot(ctx context.Context, log *zap.Logger, req Request, total int64, start time.Time) (context.Context, func(), error) {
	claim := Claim{Urgent: req.Urgent, Bytes: total}
	if req.Urgent {
		// Only an interruption's deadline orders the queue; a periodic
		// commit's bound is a safety net, not a deadline.
		claim.Deadline, _ = ctx.Deadline()
	}
	gctx, release, err := c.Gate.Acquire(ctx, claim)
	if err != nil {
		return nil, nil, fmt.Errorf("commit: waiting for an upload slot: %w", err)
	}
	if waited := time.Since(start); waited > 100*time.Millisecond {
		log.Info("upload slot granted", zap.Duration("waited", waited), zap.Int64("bytes", total), zap.Bool("urgent", req.Urgent))
	}
	return gctx, release, nil
}

// preempted is err, or ErrPreempted when the slot's context gctx was
// preempted and err does not say so already.
func preempted(gctx context.Context, err error) error {
	if errors.Is(context.Cause(gctx), ErrPreempted) && err != nil && !errors.Is(err, ErrPreempted) {
		return fmt.Errorf("commit: %w", ErrPreempted)
	}
	return err
}

// manifest is req's manifest before the upload: the files piped holds
// filled in, the others' entries left for the upload.
func (c *Committer) manifest(req Request, start time.Time, files []checkpoint.LocalFile, piped map[string]checkpoint.File) *checkpoint.Manifest {
	m := &checkpoint.Manifest{
		Format: checkpoint.Format, RunID: c.RunID, ID: req.ID, Step: req.Step, Reason: req.Reason,
		Created: start.UTC(), Source: c.Source, Metadata: req.Metadata,
		Files: make([]checkpoint.File, len(files)), Epoch: c.epoch(),
	}
	for i, f := range files {
		if pf, ok := piped[f.Rel]; ok {
			m.Files[i] = pf
		}
	}
	return m
}

// commitSingle writes the manifest of a single-node checkpoint, whose
// data is durable (the part path is commitPart, parts.go).
func (c *Committer) commitSingle(ctx context.Context, req Request, m *checkpoint.Manifest) error {
	body, err := marshalManifest(m)
	if err != nil {
		return err
	}
	key := checkpoint.ManifestKey(req.Step, req.ID)
	if err := checkpoint.PutOnce(ctx, c.Store, key, body); err != nil {
		if req.Pipeline != nil && !c.absent(key) {
			// The write may have landed (its reply lost, or a deadline
			// that ended after the store took it): then the manifest
			// names the early uploads, and deleting them would break a
			// committed checkpoint. Keep them; retention removes them if
			// no manifest lists them (found by the agent simulation).
			req.Pipeline.committed(m)
		}
		return fmt.Errorf("write manifest: %w", err)
	}
	if req.Pipeline != nil { // from here on, an Abort must not delete what it lists
		req.Pipeline.committed(m)
	}
	return nil
}

// upload puts the files indexed by todo (total bytes in all) concurrently
// and fills out with their entries.
func (c *Committer) upload(ctx context.Context, log *zap.Logger, root *os.Root, owners []int, prefix string, files []checkpoint.LocalFile, todo []int, total int64, out []checkpoint.File) error {
	p := &checkpoint.Progress{Start: time.Now(), Total: total}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go p.Report(pctx, log, "upload")

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.concurrency())
	for _, i := range todo {
		f := files[i]
		g.Go(func() error {
			crc, digest, err := c.uploadFile(gctx, root, owners, prefix+f.Rel, f, p)
			if err != nil {
				return fmt.Errorf("upload %s: %w", f.Rel, err)
			}
			out[i] = checkpoint.File{Path: f.Rel, Key: prefix + f.Rel, Size: f.Size, CRC32C: crc, BLAKE3: digest}
			return nil
		})
	}
	return g.Wait()
}

// uploadFile streams one file to the store, taking its CRC32C and digest
// on the way: the file is read once. A file that changes size while it is
// read is an error.
func (c *Committer) uploadFile(ctx context.Context, root *os.Root, owners []int, key string, f checkpoint.LocalFile, p *checkpoint.Progress) (crc, digest string, err error) {
	// Whatever was swapped in after the scan (a FIFO, a symlink, another
	// file) is refused here without blocking.
	fh, err := checkpoint.OpenScanned(root, f.Rel, f.Size, owners...)
	if err != nil {
		return "", "", err
	}
	defer fh.Close()
	ur := newUploadReader(fh, f.Size, p)
	if err := c.Store.Put(ctx, key, ur, f.Size, cloud.PutOptions{}); err != nil {
		return "", "", err
	}
	n, crc, digest, err := ur.result()
	if err != nil {
		return "", "", err
	}
	if n != f.Size {
		return "", "", fmt.Errorf("file changed while uploading: read %d bytes, expected %d", n, f.Size)
	}
	return crc, digest, nil
}

// marshalManifest encodes m and checks that it decodes to the same paths
// and keys: what restore reads back must name the objects just uploaded.
func marshalManifest(m *checkpoint.Manifest) ([]byte, error) {
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	var back checkpoint.Manifest
	if err := json.Unmarshal(body, &back); err != nil {
		return nil, fmt.Errorf("manifest does not decode: %w", err)
	}
	if len(back.Files) != len(m.Files) || back.ID != m.ID || back.Step != m.Step {
		return nil, errors.New("manifest does not survive json encoding")
	}
	for i, f := range m.Files {
		if b := back.Files[i]; b.Path != f.Path || b.Key != f.Key {
			return nil, fmt.Errorf("file %q does not survive json encoding (reads back as %q): %w", f.Path, b.Path, checkpoint.ErrRefused)
		}
	}
	return body, nil
}

// publish moves latest.json: fenced by the lease when there is one.
func (c *Committer) publish(ctx context.Context, l checkpoint.Latest) error {
	if c.Lease == nil {
		return checkpoint.UpdateLatest(ctx, c.Store, l)
	}
	return c.Lease.Publish(ctx, l)
}

// seconds is d in seconds to the millisecond, for a log field named _s.
func seconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// uploadReader is what a commit hands to Store.Put for one file: a
// checkpoint.CountingReader taking the file's CRC32C and digest
// (checkpoint.Sums) as the store reads it, or, for a store that sends
// straight from the file (cloud.FileSource), the CRC32C that store took
// and had the server verify, and the digest of the bytes it read to take
// it (cloud.ScannedSource): either way the file is read once.
type uploadReader struct {
	checkpoint.CountingReader
	f          *os.File
	size       int64
	sums       *checkpoint.Sums // what Read passed
	scan       *checkpoint.Sums // what the store read to checksum it (Scanned)
	sent       bool
	crc        uint32
	progressed atomic.Int64 // what the store's Progress reported before Sent
}

var _ cloud.ProgressSource = (*uploadReader)(nil)
var _ cloud.ScannedSource = (*uploadReader)(nil)

func newUploadReader(fh *os.File, size int64, p *checkpoint.Progress) *uploadReader {
	sums := checkpoint.NewSums()
	return &uploadReader{CountingReader: checkpoint.CountingReader{R: io.LimitReader(fh, size+1), H: sums, P: p}, f: fh, size: size, sums: sums}
}

func (u *uploadReader) SourceFile() (*os.File, int64) { return u.f, u.size }

// Scanned takes the digest of the bytes the store checksums before it
// sends them, in order, once.
func (u *uploadReader) Scanned(p []byte) {
	if u.scan == nil {
		u.scan = checkpoint.NewSums()
	}
	u.scan.Write(p)
}

func (u *uploadReader) Sent(n int64, crc32c uint32) {
	u.sent, u.crc = true, crc32c
	u.N += n
	u.P.Add(int(n - u.progressed.Load())) // the rest, or less after a resent request
}

// Progress counts the bytes the store has sent so far (a part, a read of
// the request body), so that a long upload logs a steady progress.
func (u *uploadReader) Progress(n int64) {
	u.progressed.Add(n)
	u.P.Add(int(n))
}

// errChangedWhileSent: the file's bytes read for the digest are not those
// the store sent (it changed under the upload).
var errChangedWhileSent = errors.New("file changed while it was uploaded")

// result is what was uploaded: its length, CRC32C and digest (hex). A
// store that sent from the file without showing it every byte it read
// (Scanned) has the file read once more for the digest, whose CRC32C must
// then be the one the store sent.
func (u *uploadReader) result() (n int64, crc, digest string, err error) {
	if !u.sent {
		return u.N, u.sums.CRC32C(), u.sums.Digest(), nil
	}
	crc = checkpoint.CRC32CHex(u.crc)
	s := u.scan
	if s == nil || s.Len() != u.N || s.CRC32C() != crc {
		s = checkpoint.NewSums()
		if _, err := io.Copy(s, io.NewSectionReader(u.f, 0, u.size+1)); err != nil {
			return 0, "", "", err
		}
	}
	if s.Len() != u.N || s.CRC32C() != crc {
		return 0, "", "", errChangedWhileSent
	}
	return u.N, crc, s.Digest(), nil
}
