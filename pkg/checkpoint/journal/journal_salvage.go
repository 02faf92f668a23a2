package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// ReadSalvage reads the journal for a report. A journal that parses
// is returned as is (damage nil). One that does not (truncated, a garbled
// field) is read as far as it can be: damage names each part that could
// not be read and what was done without it. A missing journal is an error
// wrapping cloud.ErrNotExist.
func ReadSalvage(ctx context.Context, st cloud.Store) (*Journal, []string, error) {
	b, err := checkpoint.ReadSmall(ctx, st, checkpoint.JournalKey, maxJournal)
	if err != nil {
		return nil, nil, err
	}
	j, damage := Salvage(b)
	return j, damage, nil
}

// Salvage parses b as a journal, leniently: entries and fields that
// do not parse are skipped and named in damage; a truncated journal keeps
// every entry before the cut. A session without a start or an interruption
// without a detection time cannot be placed and is dropped (and named).
func Salvage(b []byte) (*Journal, []string) {
	var j Journal
	if err := json.Unmarshal(b, &j); err == nil {
		return &j, nil
	}
	var damage []string
	j = Journal{}
	dec := json.NewDecoder(bytes.NewReader(b))
	cut := func(where string, err error) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		damage = append(damage, fmt.Sprintf("journal unreadable from byte %d (%s): %v; everything after is missing", dec.InputOffset(), where, err))
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		if err == nil {
			err = fmt.Errorf("not a JSON object")
		}
		cut("start", err)
		return &j, damage
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			cut("a key", err)
			break
		}
		key, _ := tok.(string)
		var ok bool
		switch key {
		case "sessions":
			ok = salvageArray(dec, key, &j.Sessions, &damage, cut)
		case "interruptions":
			ok = salvageArray(dec, key, &j.Interruptions, &damage, cut)
		case "restores":
			ok = salvageArray(dec, key, &j.Restores, &damage, cut)
		default:
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				cut(key, err)
				break
			}
			ok = true
			switch key {
			case "stats":
				salvageFields(raw, &j.Stats, "stats", &damage)
			case "format":
				_ = json.Unmarshal(raw, &j.Format)
			case "run_id":
				_ = json.Unmarshal(raw, &j.RunID)
			}
		}
		if !ok {
			break
		}
	}
	// Drop what cannot be placed in time.
	j.Sessions = dropUnplaced(j.Sessions, func(s Session) bool { return s.Start.IsZero() }, "sessions", "has no start", &damage)
	j.Interruptions = dropUnplaced(j.Interruptions, func(in Interruption) bool { return in.Detected.IsZero() }, "interruptions", "has no detected time", &damage)
	if len(damage) == 0 {
		// Unmarshal failed on something the lenient pass took in its stride
		// (e.g. an unknown top-level value type).
		damage = append(damage, "journal does not parse strictly; every known part was read")
	}
	return &j, damage
}

// dropUnplaced returns xs without the entries unplaced reports, naming
// each dropped one (key[i] why) in damage.
func dropUnplaced[T any](xs []T, unplaced func(T) bool, key, why string, damage *[]string) []T {
	var kept []T
	for i, x := range xs {
		if unplaced(x) {
			*damage = append(*damage, fmt.Sprintf("%s[%d] %s: not counted", key, i, why))
			continue
		}
		kept = append(kept, x)
	}
	return kept
}

// salvageArray reads the array value of key element by element into out.
// It reports false when the stream cannot be read further.
func salvageArray[T any](dec *json.Decoder, key string, out *[]T, damage *[]string, cut func(string, error)) bool {
	tok, err := dec.Token()
	if err != nil {
		cut(key, err)
		return false
	}
	if tok != json.Delim('[') {
		if tok == nil { // null
			return true
		}
		*damage = append(*damage, fmt.Sprintf("%s is not a list: ignored", key))
		return skipValue(dec, tok, key, cut)
	}
	for i := 0; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			cut(fmt.Sprintf("%s[%d]", key, i), err)
			return false
		}
		var v T
		salvageFields(raw, &v, fmt.Sprintf("%s[%d]", key, i), damage)
		*out = append(*out, v)
	}
	if _, err := dec.Token(); err != nil {
		cut(key, err)
		return false
	}
	return true
}

// skipValue skips the rest of a value that started with tok.
func skipValue(dec *json.Decoder, tok json.Token, key string, cut func(string, error)) bool {
	d, ok := tok.(json.Delim)
	if !ok || (d != '[' && d != '{') {
		return true
	}
	for depth := 1; depth > 0; {
		t, err := dec.Token()
		if err != nil {
			cut(key, err)
			return false
		}
		if d, ok := t.(json.Delim); ok {
			if d == '[' || d == '{' {
				depth++
			} else {
				depth--
			}
		}
	}
	return true
}

// salvageFields decodes the object raw into v field by field; a field that
// does not parse is left zero and named in damage.
func salvageFields[T any](raw json.RawMessage, v *T, where string, damage *[]string) {
	var full T
	if err := json.Unmarshal(raw, &full); err == nil {
		*v = full
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		*damage = append(*damage, fmt.Sprintf("%s is not an object: ignored", where))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		tmp := *v // a field that fails leaves v as it was
		if err := json.Unmarshal(one, &tmp); err != nil {
			*damage = append(*damage, fmt.Sprintf("%s.%s unreadable (%s): ignored", where, k, shortErr(err)))
			continue
		}
		*v = tmp
	}
}

func shortErr(err error) string {
	var pe *time.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("time %s", pe.Value)
	}
	return err.Error()
}
