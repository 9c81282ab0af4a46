package events

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// TimeLayout is how ts travels: RFC 3339 in UTC with milliseconds.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// AppendTime appends t in UTC as TimeLayout writes it (2026-11-30T12:00:00.123Z), several
// times faster than time.Time.AppendFormat for the years 0–9999.
func AppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, TimeLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / 1e6
	return append(dst,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}

// AppendRequest appends ev as JSON to dst and returns the extended slice. It writes the
// same document encoding/json would for the struct tags, without reflection or allocation
// when dst has room. A non-finite duration is written as null, so the event fails
// validation instead of carrying a made-up zero. The gateway layer, the default, is not
// written.
func AppendRequest(dst []byte, ev *RequestEvent) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(ev.V), 10)
	dst = appendStrField(dst, "event_id", ev.EventID)
	dst = append(dst, `,"ts":"`...)
	dst = AppendTime(dst, ev.TS)
	dst = append(dst, '"')
	dst = appendStrField(dst, "model", ev.Model)
	dst = appendStrField(dst, "scene", ev.Scene)
	dst = appendStrField(dst, "env", ev.Env)
	dst = appendOptStr(dst, "instance", ev.Instance)
	dst = appendOptStr(dst, "tenant", ev.Tenant)
	dst = appendOptStr(dst, "provider", ev.Provider)
	if ev.Layer != LayerGateway { // absent is gateway: a gateway event's bytes stay as they were
		dst = appendOptStr(dst, "layer", string(ev.Layer))
	}
	dst = appendOptStr(dst, "trace_id", ev.TraceID)
	dst = appendIntField(dst, "input_tokens", ev.InputTokens)
	dst = appendIntField(dst, "output_tokens", ev.OutputTokens)
	if ev.CachedInputTokens != 0 {
		dst = appendIntField(dst, "cached_input_tokens", ev.CachedInputTokens)
	}
	if ev.TokensEstimated {
		dst = append(dst, `,"tokens_estimated":true`...)
	}
	dst = appendFloatField(dst, "ttft_ms", ev.TTFTMs)
	dst = appendFloatField(dst, "total_ms", ev.TotalMs)
	if ev.MaxITLMs != 0 {
		dst = appendFloatField(dst, "max_itl_ms", ev.MaxITLMs)
	}
	if ev.QueueMs != 0 {
		dst = appendFloatField(dst, "queue_ms", ev.QueueMs)
	}
	if ev.PrefillMs != 0 {
		dst = appendFloatField(dst, "prefill_ms", ev.PrefillMs)
	}
	if ev.DecodeMs != 0 {
		dst = appendFloatField(dst, "decode_ms", ev.DecodeMs)
	}
	dst = appendStrField(dst, "status", string(ev.Status))
	dst = appendOptStr(dst, "error_code", ev.ErrorCode)
	if ev.HTTPStatus != 0 {
		dst = appendIntField(dst, "http_status", int64(ev.HTTPStatus))
	}
	if ev.Stream {
		dst = append(dst, `,"stream":true`...)
	}
	dst = appendOptStr(dst, "conversation_id", ev.ConversationID)
	if ev.Turn != 0 {
		dst = appendIntField(dst, "turn", int64(ev.Turn))
	}
	dst = appendOptStr(dst, "outcome", string(ev.Outcome))
	if len(ev.Scores) > 0 {
		dst = append(dst, `,"scores":{`...)
		for i, sc := range ev.Scores {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, sc.Name)
			dst = append(dst, ':')
			dst = AppendFloat(dst, sc.Value)
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// MarshalJSON encodes the event with AppendRequest.
func (e RequestEvent) MarshalJSON() ([]byte, error) {
	return AppendRequest(make([]byte, 0, 384), &e), nil
}

// UnmarshalJSON decodes with UnmarshalRequest, so encoding/json callers get the same rules.
func (e *RequestEvent) UnmarshalJSON(data []byte) error {
	return UnmarshalRequest(data, e)
}

func appendStrField(dst []byte, name, v string) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return AppendString(dst, v)
}

func appendOptStr(dst []byte, name, v string) []byte {
	if v == "" {
		return dst
	}
	return appendStrField(dst, name, v)
}

func appendIntField(dst []byte, name string, v int64) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return strconv.AppendInt(dst, v, 10)
}

func appendFloatField(dst []byte, name string, v float64) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return AppendFloat(dst, v)
}

// AppendFloat writes v as encoding/json does, or null when v is not finite.
func AppendFloat(dst []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(dst, "null"...)
	}
	abs := math.Abs(v)
	fmt := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		fmt = 'e'
	}
	return strconv.AppendFloat(dst, v, fmt, -1, 64)
}

const hexDigits = "0123456789abcdef"

// AppendString writes s as a JSON string. Invalid UTF-8 becomes U+FFFD, as encoding/json
// does, so the output is always valid JSON.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendStringMax appends s as AppendString does, cut after a whole character or escape so
// that the quoted string takes at most max bytes (max ≥ 2); it reports whether s was cut. It
// escapes no more of s than max bytes, so a huge s costs no more than a cut one.
func AppendStringMax(dst []byte, s string, max int) ([]byte, bool) {
	cut := len(s) > max // each byte of s takes at least one in the quoted string
	if cut {
		s = s[:max]
	}
	start := len(dst)
	dst = AppendString(dst, s)
	if !cut && len(dst)-start <= max {
		return dst, false
	}
	end, limit := start+1, start+max-1 // after the opening quote, before the closing one
	for end < len(dst)-1 {
		n := 1
		switch c := dst[end]; {
		case c == '\\' && dst[end+1] == 'u':
			n = 6
		case c == '\\':
			n = 2
		case c >= utf8.RuneSelf:
			_, n = utf8.DecodeRune(dst[end:])
		}
		if end+n > limit {
			break
		}
		end += n
	}
	return append(dst[:end], '"'), true
}

// FormatTS formats t the way ts travels.
func FormatTS(t time.Time) string { return t.UTC().Format(TimeLayout) }
