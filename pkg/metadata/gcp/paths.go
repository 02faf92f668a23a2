package gcp

// Metadata keys, relative to /computeMetadata/v1/, with a sample answer each.
const (
	// TRUE | FALSE
	keyPreempted = "instance/preempted"
	// NONE | MIGRATE_ON_HOST_MAINTENANCE | TERMINATE_ON_HOST_MAINTENANCE | SHUTDOWN_ON_HOST_MAINTENANCE
	keyMaintenance = "instance/maintenance-event"
	// 4520031799277581759
	keyInstanceID = "instance/id"
	// projects/123456789012/machineTypes/a2-highgpu-1g
	keyMachineType = "instance/machine-type"
	// TRUE | FALSE
	keyPreemptible = "instance/scheduling/preemptible"
)

// Values of instance/maintenance-event.
const (
	maintenanceNone      = "NONE"
	maintenanceMigrate   = "MIGRATE_ON_HOST_MAINTENANCE"
	maintenanceTerminate = "TERMINATE_ON_HOST_MAINTENANCE"
	maintenanceShutdown  = "SHUTDOWN_ON_HOST_MAINTENANCE"
)

const (
	basePath    = "/computeMetadata/v1/"
	flavorKey   = "Metadata-Flavor"
	flavorValue = "Google"
	hostEnv     = "GCE_METADATA_HOST"
	defaultHost = "169.254.169.254"
)
