package session

import (
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// MachineOf converts the metadata package's identity into the schema the
// manifest, journal and lease own (checkpoint.Machine): the boundary
// between what the cloud says and what is written to the store.
func MachineOf(id metadata.Identity) checkpoint.Machine {
	return checkpoint.Machine{Cloud: string(id.Cloud), InstanceID: id.InstanceID, InstanceType: id.InstanceType,
		Zone: id.Zone, Lifecycle: id.Lifecycle, Name: id.Name}
}
