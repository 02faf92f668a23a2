package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSlotQueue_BusyNeverBesideBounded: the torch slots' queue never holds
// more tests than slots, never a parallelBusy test beside a
// parallelTorchBounded one, and gives every test its slot.
func TestSlotQueue_BusyNeverBesideBounded(t *testing.T) {
	parallel(t)
	q := newSlotQueue(2)
	var mu sync.Mutex
	holding := map[torchClass]int{}
	ran := 0
	var bad []string
	t.Run("group", func(t *testing.T) {
		classes := []torchClass{torchBounded, torchBusy, torchPlain, torchBounded, torchBusy, torchBounded, torchPlain, torchBusy}
		for i, c := range classes {
			t.Run(fmt.Sprintf("%d-class%d", i, c), func(t *testing.T) {
				q.run(t, c)
				mu.Lock()
				holding[c]++
				ran++
				if n := holding[torchPlain] + holding[torchBusy] + holding[torchBounded]; n > 2 {
					bad = append(bad, fmt.Sprintf("%s: %d tests hold the 2 slots", t.Name(), n))
				}
				if holding[torchBusy] > 0 && holding[torchBounded] > 0 {
					bad = append(bad, fmt.Sprintf("%s: a busy test beside a bounded one", t.Name()))
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the test's work, while it holds its slot
				mu.Lock()
				holding[c]--
				mu.Unlock()
			})
		}
	})
	if ran != 8 {
		t.Errorf("%d of 8 tests ran", ran)
	}
	for _, b := range bad {
		t.Error(b)
	}
}
