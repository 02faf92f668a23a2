package azure

const (
	// {"DocumentIncarnation": 2, "Events": [{"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
	//   "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["trainer-vm-1"],
	//   "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
	//   "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}]}
	// POST {"StartRequests": [{"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123"}]} acknowledges.
	pathScheduledEvents = "/metadata/scheduledevents?api-version=2020-07-01"
	// {"compute": {"name": "trainer-vm-1", "vmId": "02aab8a4-...", "vmSize": "Standard_NC6s_v3",
	//   "location": "eastus", "zone": "1", "priority": "Spot", ...}, "network": {...}}
	pathInstance = "/metadata/instance?api-version=2021-02-01"

	endpointEnv     = "SPOTAGENT_AZURE_METADATA_ENDPOINT"
	defaultEndpoint = "http://169.254.169.254"
)
