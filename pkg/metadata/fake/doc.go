// Package fake serves fake cloud metadata services over real HTTP, in the
// clouds' own wire formats, for tests, benchmarks and demos:
//
//   - AWS: IMDSv2 (PUT /latest/api/token, then X-aws-ec2-metadata-token on
//     every GET), spot/instance-action, rebalance recommendations, scheduled
//     maintenance events, Auto Scaling target lifecycle state, identity.
//   - GCP: /computeMetadata/v1 with Metadata-Flavor: Google, ETags and
//     wait_for_change hanging GETs on instance/preempted and
//     instance/maintenance-event.
//   - Azure: IMDS instance document and Scheduled Events with Metadata: true,
//     api-version, DocumentIncarnation, and recorded StartRequests acks.
//
// Each fake starts on a free loopback port (NewAWS, NewGCP, NewAzure) or on
// a fixed address (StartAWS, StartGCP, StartAzure, Start). Every method that
// exposes a notice returns the instant it became visible to clients, so a
// test can measure detection latency; LastExposed returns the latest one.
// SetFault makes every answer fail in a chosen way until SetFault(FaultNone).
//
// Env returns the environment variable that points a client at the fake
// (AWS_EC2_METADATA_SERVICE_ENDPOINT, GCE_METADATA_HOST,
// SPOTAGENT_AZURE_METADATA_ENDPOINT).
package fake
