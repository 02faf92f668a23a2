package protocol

import (
	"regexp"
	"strings"
)

// podUID finds a Kubernetes pod UID in a cgroup path, as the kubelet
// names it with the cgroupfs driver (/kubepods/burstable/pod<uid>/...) or
// the systemd one (kubepods-burstable-pod<uid_with_underscores>.slice).
var podUID = regexp.MustCompile(`kubepods.*?[/-]pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})`)

// podFromCgroup returns the pod UID in the contents of /proc/<pid>/cgroup,
// or "" when the process is not in a pod's cgroup.
func podFromCgroup(cgroup string) string {
	for _, line := range strings.Split(cgroup, "\n") {
		if m := podUID.FindStringSubmatch(line); m != nil {
			return strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))
		}
	}
	return ""
}
