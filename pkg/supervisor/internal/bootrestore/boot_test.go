package bootrestore

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// bg runs the restores' goroutines as the agent's goBgFail does.
type bg struct{ wg sync.WaitGroup }

func (b *bg) goBgFail(fn func(), fail func(error)) {
	b.wg.Add(1)
	go func() { defer b.wg.Done(); fn() }()
}

// socket is a real socket; hello dials it as a trainer of protocol
// version and returns the agent's side of the hello.
type socket struct {
	t    *testing.T
	srv  *protocol.Server
	path string
}

func serve(t *testing.T) *socket {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t), "s.sock")
	srv, err := protocol.Listen(protocol.ServerConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); srv.Close(); <-done })
	return &socket{t: t, srv: srv, path: path}
}

func (s *socket) hello(version int) (*trainertest.Trainer, protocol.Event) {
	s.t.Helper()
	tr := trainertest.Dial(s.t, s.path)
	tr.Send(map[string]any{"type": protocol.TypeHello, "version": version, "pid": 1})
	select {
	case ev := <-s.srv.Events():
		return tr, ev
	case <-time.After(testutil.Wait):
		s.t.Fatal("no hello")
	}
	return nil, protocol.Event{}
}

func welcome(m protocol.Message, r *protocol.Resume) protocol.Message {
	return protocol.Message{Type: protocol.TypeWelcome, Resume: r}
}

// startBeside is a Boot whose start's restore (fetch) runs beside: its
// record resumes step 7.
func startBeside(g *bg, fetch func(context.Context) (*localdirs.Fetched, error)) Boot {
	b := New(Env{Life: context.Background(), GoBgFail: g.goBgFail, Fetch: fetch, Log: zap.NewNop(),
		Record: func(f *localdirs.Fetched) *protocol.Resume {
			if f == nil {
				return nil
			}
			return &protocol.Resume{Step: 7, Manifest: f.Manifest}
		}})
	b.StartBeside()
	return b
}

func ended(t *testing.T, b *Boot) Result {
	t.Helper()
	select {
	case res := <-b.Done():
		return res
	case <-time.After(testutil.Wait):
		t.Fatal("the restore did not end")
	}
	return Result{}
}

func TestBoot_RestoredTellsTheTrainersWaiting(t *testing.T) {
	s := serve(t)
	var g bg
	release := make(chan struct{})
	b := startBeside(&g, func(ctx context.Context) (*localdirs.Fetched, error) {
		<-release
		return &localdirs.Fetched{Manifest: "m"}, nil
	})
	if !b.Restoring() {
		t.Fatal("not restoring")
	}
	v2, ev2 := s.hello(2)
	w, handled := b.Hello(ev2, zap.NewNop(), welcome)
	if !handled || w == nil || w.Restore != protocol.RestorePending {
		t.Fatalf("protocol 2 hello during the restore: welcome %+v handled %v, want restore pending", w, handled)
	}
	_, ev1 := s.hello(1)
	if w, handled := b.Hello(ev1, zap.NewNop(), welcome); !handled || w != nil {
		t.Fatalf("protocol 1 hello during the restore: welcome %+v handled %v, want it held", w, handled)
	}
	close(release)
	res := ended(t, &b)
	p, err, ok := b.Ended(res, zap.NewNop(), func() { t.Error("a restore that worked counted as an error") })
	if err != nil || !ok || res.Fetched.Manifest != "m" || b.Restoring() || b.Failed() || b.Aborted() {
		t.Fatalf("ended: err %v ok %v restoring %v failed %v aborted %v", err, ok, b.Restoring(), b.Failed(), b.Aborted())
	}
	var handed, admitted []uint64
	p.Restored(b.Resume(), zap.NewNop(), func(r *protocol.Resume, c *protocol.Conn) { handed = append(handed, c.ID()) },
		func(ev protocol.Event) { admitted = append(admitted, ev.Conn.ID()) })
	if len(handed) != 1 || handed[0] != ev2.Conn.ID() || len(admitted) != 1 || admitted[0] != ev1.Conn.ID() {
		t.Fatalf("handed %v admitted %v, want the pending one handed, the held one admitted", handed, admitted)
	}
	if m := v2.Expect(protocol.TypeRestored); m.Resume == nil || m.Resume.Step != 7 {
		t.Fatalf("restored %+v, want step 7", m)
	}
	if _, handled := b.Hello(ev2, zap.NewNop(), welcome); handled {
		t.Fatal("a hello after the restore is not served as usual")
	}
	g.wg.Wait()
}

func TestBoot_FailedRestoreGivesTheStartUp(t *testing.T) {
	s := serve(t)
	var g bg
	b := startBeside(&g, func(context.Context) (*localdirs.Fetched, error) {
		return nil, errors.New("restore: store down")
	})
	v2, ev2 := s.hello(2)
	b.Hello(ev2, zap.NewNop(), welcome)
	errs := 0
	_, err, ok := b.Ended(ended(t, &b), zap.NewNop(), func() { errs++ })
	if err == nil || ok || errs != 1 || !b.Failed() || !b.Aborted() {
		t.Fatalf("failed restore: err %v ok %v errors %d failed %v aborted %v", err, ok, errs, b.Failed(), b.Aborted())
	}
	if m := v2.Expect(protocol.TypeRestoreFailed); m.Error != "restore: store down" {
		t.Fatalf("restore_failed %+v", m)
	}
	if code, err, ok := b.Exit(); !ok || code != 1 || err == nil {
		t.Fatalf("exit %d %v %v, want 1 with the error", code, err, ok)
	}
	// A later hello learns at once that the run could not start.
	_, late := s.hello(2)
	if w, handled := b.Hello(late, zap.NewNop(), welcome); !handled || w == nil || w.Restore != protocol.RestoreFailed {
		t.Fatalf("hello after the failure: %+v %v, want restore failed", w, handled)
	}
	g.wg.Wait()
}

func TestBoot_SignalCancelsTheRestore(t *testing.T) {
	var g bg
	b := startBeside(&g, func(ctx context.Context) (*localdirs.Fetched, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if !b.Abort("signal terminated", &Abort{Sig: syscall.SIGTERM}) || !b.Aborted() {
		t.Fatal("no restore aborted")
	}
	b.Abort("a notice", &Abort{Notice: true}) // the first reason stands
	_, err, ok := b.Ended(ended(t, &b), zap.NewNop(), func() { t.Error("a cancelled restore counted as an error") })
	if err != nil || ok || !b.Failed() {
		t.Fatalf("cancelled: err %v ok %v failed %v", err, ok, b.Failed())
	}
	if code, _, ok := b.Exit(); !ok || code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d (%v), want 143", code, ok)
	}
	if b.Abort("again", &Abort{}) {
		t.Fatal("aborted a restore that is over")
	}
	g.wg.Wait()
}

func TestBoot_TrainerExitedCancelsOnce(t *testing.T) {
	var g bg
	var idle Boot
	idle.TrainerExited() // no restore: nothing to do
	b := startBeside(&g, func(ctx context.Context) (*localdirs.Fetched, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b.TrainerExited()
	b.TrainerExited()
	if _, _, ok := b.Ended(ended(t, &b), zap.NewNop(), func() {}); ok || b.Aborted() || !b.Failed() {
		t.Fatalf("trainer exited: ok %v aborted %v failed %v, want a cancelled restore, the start not given up", ok, b.Aborted(), b.Failed())
	}
	if _, _, ok := b.Exit(); ok {
		t.Fatal("a start that was not given up answers the exit")
	}
	g.wg.Wait()
}

func TestBoot_AbandonDueOnce(t *testing.T) {
	var b Boot
	now := time.Now()
	if b.AbandonDue(now) || !b.AbandonAt().IsZero() {
		t.Fatal("due with nothing to abandon")
	}
	b.StopTrainerAt(now.Add(time.Second))
	if b.AbandonDue(now) {
		t.Fatal("due before its time")
	}
	if !b.AbandonDue(now.Add(time.Second)) || b.AbandonDue(now.Add(time.Hour)) {
		t.Fatal("not due once at its time")
	}
}

func TestBoot_RejoinRestoresTheNewestCommit(t *testing.T) {
	s := serve(t)
	var g bg
	fetches := 0
	b := New(Env{Life: context.Background(), GoBgFail: g.goBgFail, Log: zap.NewNop(), Errs: func() { t.Error("rejoin counted as an error") },
		Fetch:  func(context.Context) (*localdirs.Fetched, error) { fetches++; return &localdirs.Fetched{}, nil },
		Record: func(*localdirs.Fetched) *protocol.Resume { return &protocol.Resume{ID: "c2", Step: 20} },
		Hand:   func(*protocol.Resume, *protocol.Conn) {},
		Admit:  func(protocol.Event, *protocol.Resume) {}})
	b.resume = &protocol.Resume{ID: "c1", Step: 10}
	last := Committed{ID: "c2", Step: 20}
	b.RejoinHello(last, 0, 1)
	if !b.Busy() {
		t.Fatal("a hello after a newer commit: no rejoin restore")
	}
	tr, ev := s.hello(2)
	if w, handled := b.Hello(ev, zap.NewNop(), welcome); !handled || w.Restore != protocol.RestorePending || w.Resume != nil {
		t.Fatalf("hello waiting for the rejoin: %+v, want pending without the older resume", w)
	}
	b.RejoinTick(last, 1)
	if b.RejoinDone() != nil {
		t.Fatal("the rejoin restore started with an upload in flight")
	}
	b.RejoinTick(last, 0)
	var res Result
	select {
	case res = <-b.RejoinDone():
	case <-time.After(testutil.Wait):
		t.Fatal("the rejoin restore did not end")
	}
	b.OnRejoined(res)
	if b.Busy() || b.Resume().ID != "c2" || fetches != 1 {
		t.Fatalf("rejoined: rejoining %v resume %+v fetches %d", b.Busy(), b.Resume(), fetches)
	}
	if m := tr.Expect(protocol.TypeRestored); m.Resume == nil || m.Resume.ID != "c2" {
		t.Fatalf("restored %+v, want c2", m)
	}
	b.RejoinHello(last, 1, 0) // another rank of the same group: the same decision
	if b.Busy() {
		t.Fatal("a second hello for the same commit restores again")
	}
	g.wg.Wait()
}
