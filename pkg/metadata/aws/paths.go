package aws

// IMDS paths, relative to /latest/meta-data/, with a sample answer each.
const (
	// 404 when there is no notice, else:
	// {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
	pathInstanceAction = "spot/instance-action"
	// 404 when there is none, else:
	// {"noticeTime": "2020-10-27T08:22:00Z"}
	pathRebalance = "events/recommendations/rebalance"
	// [ {"NotBefore" : "21 Jan 2019 09:00:43 GMT", "Code" : "system-reboot",
	//    "Description" : "scheduled reboot", "EventId" : "instance-event-0d59937288b749b32",
	//    "NotAfter" : "21 Jan 2019 09:17:23 GMT", "State" : "active"} ]
	pathScheduled = "events/maintenance/scheduled"
	// InService | Terminated | Warmed:Stopped | ...; 404 until populated
	pathLifecycle = "autoscaling/target-lifecycle-state"

	// i-0123456789abcdef0
	pathInstanceID = "instance-id"
	// g5.xlarge
	pathInstanceType = "instance-type"
	// us-east-1a
	pathZone = "placement/availability-zone"
	// spot | on-demand | scheduled
	pathLifecycleType = "instance-life-cycle"
)
