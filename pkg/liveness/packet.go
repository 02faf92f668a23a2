package liveness

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
)

// A packet is magic, then HMAC-SHA256(token, body), then body (JSON).
const (
	magic     = "SAL1"
	macSize   = sha256.Size
	maxPacket = 1024
)

// body is what a heartbeat says.
type body struct {
	Run     string `json:"run"`
	From    int    `json:"from"`
	To      int    `json:"to"`
	Session string `json:"session"`
	Started int64  `json:"started"` // the session's start, unix ns: a later session replaces an earlier one
	Seq     uint64 `json:"seq"`     // grows with every packet of a session
	Leave   bool   `json:"leave,omitempty"`
}

func mac(token, b []byte) []byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte(magic))
	h.Write(b)
	return h.Sum(nil)
}

func seal(token []byte, b body) []byte {
	j, _ := json.Marshal(b) // plain fields: cannot fail
	out := make([]byte, 0, len(magic)+macSize+len(j))
	out = append(out, magic...)
	out = append(out, mac(token, j)...)
	return append(out, j...)
}

// open checks a packet's seal and returns its body.
func open(token, pkt []byte) (body, bool) {
	var b body
	if len(pkt) > maxPacket || len(pkt) < len(magic)+macSize || string(pkt[:len(magic)]) != magic {
		return b, false
	}
	sum, j := pkt[len(magic):len(magic)+macSize], pkt[len(magic)+macSize:]
	if !hmac.Equal(sum, mac(token, j)) {
		return b, false
	}
	if err := json.Unmarshal(j, &b); err != nil {
		return b, false
	}
	return b, true
}

// HeartbeatSize is the UDP payload of one heartbeat of run from node to
// node's neighbour by session (for the cost figures: bench's detect
// section and docs/distributed.md).
func HeartbeatSize(run, session string, node int) int {
	return len(seal(make([]byte, 32), body{Run: run, From: node, To: node + 1, Session: session,
		Started: 1 << 60, Seq: 1 << 32}))
}
