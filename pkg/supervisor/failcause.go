package supervisor

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"
)

// failCauses are the causes of a failed checkpoint the agent names, each
// with what to do about it: the file system errors a save or a commit
// meets. A cause is found in the agent's own error (errors.Is) or in the
// text of a trainer's `failed` (the Python client sends an OSError as
// "ENOSPC: [Errno 28] No space left on device: ...").
var failCauses = []struct {
	errno syscall.Errno
	name  string
	fix   string
}{
	{syscall.ENOSPC, "ENOSPC", "the checkpoint directory's disk is full: free space or give the agent a larger --checkpoint-dir; it needs room for about two checkpoints (the one being saved and the local copy of the last, --local-keep; 0 keeps none)"},
	{syscall.EDQUOT, "EDQUOT", "the disk quota of the checkpoint directory is used up: raise it or give the agent another --checkpoint-dir; it needs room for about two checkpoints"},
	{syscall.EACCES, "EACCES", "permission denied: the trainer cannot write the checkpoint directory (a trainer of another user needs --allow-uid; docs/operations.md)"},
	{syscall.EPERM, "EPERM", "operation not permitted on the checkpoint directory: check its owner and mode"},
	{syscall.EROFS, "EROFS", "the checkpoint directory is on a read-only file system: mount it read-write or give the agent another --checkpoint-dir"},
	{syscall.EIO, "EIO", "I/O error on the checkpoint directory's disk: it may be failing"},
	{syscall.EMFILE, "EMFILE", "too many open files: raise the trainer's file limit (ulimit -n)"},
	{syscall.ENAMETOOLONG, "ENAMETOOLONG", "a checkpoint file's name is too long for the file system"},
}

// pyErrno matches the errno of a Python OSError's text ("[Errno 28] ...").
var pyErrno = regexp.MustCompile(`\[Errno (\d+)\]`)

// failureCause names the cause of a failed checkpoint (err: the agent's
// own error, or nil; text: a trainer's `failed` message) and what to do
// about it; both empty when neither says.
func failureCause(err error, text string) (name, fix string) {
	var no syscall.Errno
	if err != nil && errors.As(err, &no) {
		for _, c := range failCauses {
			if no == c.errno {
				return c.name, c.fix
			}
		}
		return "", ""
	}
	if m := pyErrno.FindStringSubmatch(text); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			for _, c := range failCauses {
				if int(c.errno) == n {
					return c.name, c.fix
				}
			}
		}
	}
	lower := strings.ToLower(text)
	for _, c := range failCauses {
		if wordIn(text, c.name) || strings.Contains(lower, c.errno.Error()) {
			return c.name, c.fix
		}
	}
	return "", ""
}

// causeFields are the log fields of a failed checkpoint's cause (none
// when it is not known).
func causeFields(err error, text string) []zap.Field {
	name, fix := failureCause(err, text)
	if name == "" {
		return nil
	}
	return []zap.Field{zap.String("cause", name), zap.String("fix", fix)}
}

// wordIn: w occurs in s as a word of its own (ENOSPC, never inside XENOSPCX).
func wordIn(s, w string) bool {
	for i := strings.Index(s, w); i >= 0; {
		end := i + len(w)
		if (i == 0 || !isWordByte(s[i-1])) && (end == len(s) || !isWordByte(s[end])) {
			return true
		}
		j := strings.Index(s[i+1:], w)
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z'
}
