// Package deploy holds the deployment files of spotagent (systemd unit, EC2
// user-data, Kubernetes manifests) and the tests that validate them with the
// real tools: systemd-analyze, shellcheck and strict decoding into k8s.io/api.
package deploy
