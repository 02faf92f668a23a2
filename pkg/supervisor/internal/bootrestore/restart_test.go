package bootrestore

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// restartBoot is a Boot whose restores fetch with fetch and record step 9;
// errs counts the restore errors.
func restartBoot(t *testing.T, g *bg, errs *int, fetch func(context.Context) (*localdirs.Fetched, error)) *Boot {
	t.Helper()
	b := New(Env{Life: context.Background(), GoBgFail: g.goBgFail, Fetch: fetch, Log: zap.NewNop(), Errs: func() { *errs++ },
		Record: func(f *localdirs.Fetched) *protocol.Resume {
			if f == nil {
				return nil
			}
			return &protocol.Resume{ID: "c9", Step: 9}
		},
		Hand:  func(*protocol.Resume, *protocol.Conn) {},
		Admit: func(protocol.Event, *protocol.Resume) {}})
	return &b
}

func restarted(t *testing.T, b *Boot) (bool, error) {
	t.Helper()
	select {
	case res := <-b.RestartDone():
		return b.OnRestarted(res)
	case <-time.After(testutil.Wait):
		t.Fatal("the restart's restore did not end")
	}
	return false, nil
}

func TestBoot_RestartRestore(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		s := serve(t)
		var g bg
		errs := 0
		release := make(chan struct{})
		b := restartBoot(t, &g, &errs, func(context.Context) (*localdirs.Fetched, error) {
			<-release
			return &localdirs.Fetched{}, nil
		})
		b.StartRestart()
		if !b.Restarting() || !b.Busy() {
			t.Fatal("a restart's restore runs: not restarting, not busy")
		}
		// A hello meanwhile waits for it, as for the start's.
		tr, ev := s.hello(2)
		if w, handled := b.Hello(ev, zap.NewNop(), welcome); !handled || w == nil || w.Restore != protocol.RestorePending {
			t.Fatalf("hello during a restart's restore: %+v %v, want restore pending", w, handled)
		}
		close(release)
		if start, err := restarted(t, b); !start || err != nil || errs != 0 {
			t.Fatalf("restarted: start %v err %v errors %d, want the trainer started", start, err, errs)
		}
		if b.Restarting() || b.Resume() == nil || b.Resume().Step != 9 {
			t.Fatalf("after the restore: restarting %v resume %+v, want step 9 recorded", b.Restarting(), b.Resume())
		}
		if m := tr.Expect(protocol.TypeRestored); m.Resume == nil || m.Resume.Step != 9 {
			t.Fatalf("restored %+v, want step 9", m)
		}
		g.wg.Wait()
	})
	t.Run("Failed", func(t *testing.T) {
		var g bg
		errs := 0
		b := restartBoot(t, &g, &errs, func(context.Context) (*localdirs.Fetched, error) {
			return nil, errors.New("restore: store down")
		})
		b.StartRestart()
		if start, err := restarted(t, b); start || err == nil || errs != 1 {
			t.Fatalf("restarted: start %v err %v errors %d, want the error counted once", start, err, errs)
		}
		g.wg.Wait()
	})
	t.Run("Cancelled", func(t *testing.T) {
		s := serve(t)
		var g bg
		errs := 0
		b := restartBoot(t, &g, &errs, func(ctx context.Context) (*localdirs.Fetched, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		if b.CancelRestart("shutdown") {
			t.Fatal("cancelled a restart's restore that never started")
		}
		b.StartRestart()
		tr, ev := s.hello(2)
		b.Hello(ev, zap.NewNop(), welcome)
		if !b.CancelRestart("shutdown") || b.CancelRestart("again") {
			t.Fatal("not cancelled once")
		}
		if start, err := restarted(t, b); start || err != nil || errs != 0 {
			t.Fatalf("restarted: start %v err %v errors %d, want neither a start nor an error", start, err, errs)
		}
		if m := tr.Expect(protocol.TypeRestoreFailed); !strings.Contains(m.Error, "restore cancelled: shutdown") {
			t.Fatalf("restore_failed %+v, want it to say the restore was cancelled", m)
		}
		if b.Busy() || b.Failed() || b.Aborted() {
			t.Fatal("a cancelled restart's restore leaves the boot busy, failed or aborted")
		}
		g.wg.Wait()
	})
}

func TestStartCancelled_ExitsAsAShell(t *testing.T) {
	for _, tc := range []struct {
		sig  os.Signal
		want int
	}{{syscall.SIGTERM, 143}, {syscall.SIGINT, 130}, {os.Kill, 137}} {
		code, err := StartCancelled(tc.sig)
		if code != tc.want || err == nil {
			t.Errorf("StartCancelled(%v) = %d, %v; want %d and an error", tc.sig, code, err, tc.want)
		}
	}
}
