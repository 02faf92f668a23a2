//go:build !linux

package child

import (
	"errors"
	"syscall"

	"go.uber.org/zap"
)

func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// GuardArg names the guard process on Linux; elsewhere there is none.
const GuardArg = "__spotagent_guard"

// RunGuardIfAsked does nothing where there is no guard.
func RunGuardIfAsked() {}

type guard struct{}

func startGuard(int, *zap.Logger) (*guard, error) { return nil, errors.New("guard: linux only") }
func (g *guard) release()                         {}
func (g *guard) PID() int                         { return 0 }
