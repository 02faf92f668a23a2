package s3

import (
	"context"
	"testing"
)

// TestBufPool_ReusesWhileBusyDropsWhenIdle: standard buffers are reused
// while any is out, and let go once every one is back.
func TestBufPool_ReusesWhileBusyDropsWhenIdle(t *testing.T) {
	ctx := context.Background()
	p := newBufPool(4<<10, 1<<10)
	a, _ := p.get(ctx, 1<<10)
	b, _ := p.get(ctx, 1<<10)
	p.put(a)
	if p.idle() != 1 {
		t.Fatalf("idle=%d while b is out, want 1 (a kept)", p.idle())
	}
	c, _ := p.get(ctx, 1<<10)
	if &c[0] != &a[0] {
		t.Fatal("a busy pool allocated instead of reusing the idle buffer")
	}
	p.put(c)
	p.put(b)
	if p.idle() != 0 {
		t.Fatalf("idle=%d with nothing out, want 0 (let go)", p.idle())
	}
	// The budget is whole again: four buffers at once.
	for range 4 {
		if _, err := p.get(ctx, 1<<10); err != nil {
			t.Fatal(err)
		}
	}
}
