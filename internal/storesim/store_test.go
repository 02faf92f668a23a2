package storesim_test

import (
	"testing"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
)

// TestConformance holds the in-memory store to the contract of the real
// backends: the simulation cannot rely on a behaviour they lack.
func TestConformance(t *testing.T) {
	cloudtest.Run(t, func(t *testing.T) cloud.Store { return storesim.New() })
}
