package events

import (
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// maxDepth bounds the nesting of unknown fields the decoder skips, so hostile input cannot
// exhaust the stack.
const maxDepth = 64

// UnmarshalRequest decodes one request event from JSON into ev, replacing its contents.
// Unknown fields are ignored, null counts as absent, and the fields a schema-less client could
// omit by mistake (input_tokens, output_tokens, ttft_ms, total_ms) must be present. An absent
// layer is LayerGateway; an empty one is an error, like any value that is not a layer. It
// allocates once for all of the event's strings. It does not validate: call ValidateAt.
func UnmarshalRequest(data []byte, ev *RequestEvent) error {
	d := decodeState{s: string(data)}
	return d.request(ev)
}

// Decoder decodes request events without allocating in steady state: label values (model,
// scene, env, …) are interned in a bounded table, and every other string aliases the input.
// Data passed to Decode must therefore not be modified while the event is in use (a NATS
// message's payload never is); clone a string that is kept longer. A Decoder is not safe for
// concurrent use.
type Decoder struct {
	labels map[string]string
	max    int
}

// NewDecoder returns a Decoder that interns at most maxLabels distinct label values; past
// that, labels alias the input like other strings.
func NewDecoder(maxLabels int) *Decoder {
	return &Decoder{labels: make(map[string]string, min(maxLabels, 1024)), max: maxLabels}
}

// Decode decodes one request event into ev; see UnmarshalRequest for the rules and Decoder
// for the aliasing of strings.
func (dec *Decoder) Decode(data []byte, ev *RequestEvent) error {
	d := decodeState{s: unsafe.String(unsafe.SliceData(data), len(data)), dec: dec}
	return d.request(ev)
}

func (dec *Decoder) intern(s string) string {
	if v, ok := dec.labels[s]; ok {
		return v
	}
	if len(dec.labels) >= dec.max {
		return s
	}
	c := strings.Clone(s)
	dec.labels[c] = c
	return c
}

type decodeState struct {
	s   string
	i   int
	dec *Decoder
}

// required numeric fields, whose absence a zero value cannot show
const (
	seenInput = 1 << iota
	seenOutput
	seenTTFT
	seenTotal
)

// request decodes the event. A message of another version than this package's may name and
// type its fields otherwise: whatever else is wrong with it, it is unsupported_version, so a
// producer ahead of its consumers learns the real reason from the dead letter.
func (d *decodeState) request(ev *RequestEvent) error {
	err := d.requestFields(ev)
	if err != nil && !errors.Is(err, ErrMalformed) {
		if v, ok := version(d.s); ok && v != Version && v != 0 {
			return fieldErr("v", ErrUnsupportedVersion, strconv.FormatInt(v, 10))
		}
	}
	return err
}

// version finds the top-level "v" of a JSON object, the last one if there are more, as the
// decoder takes it; it reports false when there is none or the object cannot be read.
func version(s string) (v int64, ok bool) {
	d := decodeState{s: s}
	d.ws()
	if !d.take('{') {
		return 0, false
	}
	d.ws()
	if d.take('}') {
		return 0, false
	}
	for {
		d.ws()
		key, err := d.str()
		if err != nil {
			return 0, false
		}
		d.ws()
		if !d.take(':') {
			return 0, false
		}
		d.ws()
		if key == "v" {
			if v, err = d.integer(key); err != nil {
				return 0, false
			}
			ok = true
		} else if d.skip(0) != nil {
			return 0, false
		}
		d.ws()
		if d.take(',') {
			continue
		}
		return v, ok && d.take('}')
	}
}

func (d *decodeState) requestFields(ev *RequestEvent) error {
	*ev = RequestEvent{}
	var seen uint8
	var keys uint64 // the known keys read, to refuse one given twice
	d.ws()
	if !d.take('{') {
		return d.syntax("expected a JSON object")
	}
	d.ws()
	if !d.take('}') {
		for {
			d.ws()
			key, err := d.str()
			if err != nil {
				return err
			}
			d.ws()
			if !d.take(':') {
				return d.syntax("expected ':' after object key")
			}
			d.ws()
			if err := d.known(&keys, requestKey(key), key, requestKeys); err != nil {
				return err
			}
			if err := d.requestField(ev, key, &seen); err != nil {
				return err
			}
			d.ws()
			if d.take(',') {
				continue
			}
			if d.take('}') {
				break
			}
			return d.syntax("expected ',' or '}' in object")
		}
	}
	d.ws()
	if d.i != len(d.s) {
		return d.syntax("unexpected data after the object")
	}
	if ev.Layer == "" {
		ev.Layer = LayerGateway
	}
	switch {
	case seen&seenInput == 0:
		return fieldErr("input_tokens", ErrMissingField, "")
	case seen&seenOutput == 0:
		return fieldErr("output_tokens", ErrMissingField, "")
	case seen&seenTTFT == 0:
		return fieldErr("ttft_ms", ErrMissingField, "")
	case seen&seenTotal == 0:
		return fieldErr("total_ms", ErrMissingField, "")
	}
	return nil
}

// once records the known key whose bit is bit (0: an unknown key, not tracked) among those
// read, and refuses it when it was read before: a key given twice is malformed (decoders
// differ on which one wins; the HTTP ingest, the aggregator and every other reader of the
// stream must see the same event).
func (d *decodeState) once(keys *uint64, bit uint64, key string) error {
	if *keys&bit != 0 {
		return d.syntax("key " + quoteBounded(key) + " given twice")
	}
	*keys |= bit
	return nil
}

// known is once for a key whose bit is bit, and refuses an unknown key that is one of
// names in other letter case: encoding/json would take "Tenant" (or "\u017fcene", by Unicode
// folding) for the field, where the schema, other languages and this decoder see another
// property, so the readers of one stream would see different events. As checkKeys does for
// the messages decoded with encoding/json, such a key is malformed.
func (d *decodeState) known(keys *uint64, bit uint64, key string, names []string) error {
	if bit != 0 {
		return d.once(keys, bit, key)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; 'A' <= c && c <= 'Z' || c >= utf8.RuneSelf {
			for _, name := range names {
				if strings.EqualFold(key, name) {
					return d.syntax("key " + quoteBounded(key) + " is not " + strconv.Quote(name) + ": keys are case-sensitive")
				}
			}
			return nil
		}
	}
	return nil
}

// requestKeys are the keys requestKey knows.
var requestKeys = []string{"v", "event_id", "ts", "model", "scene", "env", "instance", "tenant", "provider", "layer",
	"trace_id", "error_code", "conversation_id", "status", "outcome", "input_tokens", "output_tokens",
	"cached_input_tokens", "ttft_ms", "total_ms", "max_itl_ms", "queue_ms", "prefill_ms", "decode_ms", "stream",
	"tokens_estimated", "http_status", "turn", "scores"}

// requestKey returns the bit of a request event's known key, 0 for another.
func requestKey(key string) uint64 {
	switch key {
	case "v":
		return 1 << 0
	case "event_id":
		return 1 << 1
	case "ts":
		return 1 << 2
	case "model":
		return 1 << 3
	case "scene":
		return 1 << 4
	case "env":
		return 1 << 5
	case "instance":
		return 1 << 6
	case "tenant":
		return 1 << 7
	case "provider":
		return 1 << 8
	case "layer":
		return 1 << 9
	case "trace_id":
		return 1 << 10
	case "error_code":
		return 1 << 11
	case "conversation_id":
		return 1 << 12
	case "status":
		return 1 << 13
	case "outcome":
		return 1 << 14
	case "input_tokens":
		return 1 << 15
	case "output_tokens":
		return 1 << 16
	case "cached_input_tokens":
		return 1 << 17
	case "ttft_ms":
		return 1 << 18
	case "total_ms":
		return 1 << 19
	case "max_itl_ms":
		return 1 << 20
	case "queue_ms":
		return 1 << 21
	case "prefill_ms":
		return 1 << 22
	case "decode_ms":
		return 1 << 23
	case "stream":
		return 1 << 24
	case "tokens_estimated":
		return 1 << 25
	case "http_status":
		return 1 << 26
	case "turn":
		return 1 << 27
	case "scores":
		return 1 << 28
	}
	return 0
}

func (d *decodeState) requestField(ev *RequestEvent, key string, seen *uint8) error {
	if d.null() {
		return nil
	}
	var err error
	switch key {
	case "v":
		var n int64
		n, err = d.integer(key)
		ev.V = int(n)
	case "event_id":
		ev.EventID, err = d.strValue(key)
	case "ts":
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.TS, err = parseTS(key, s)
		}
	case "model":
		ev.Model, err = d.label(key)
	case "scene":
		ev.Scene, err = d.label(key)
	case "env":
		ev.Env, err = d.label(key)
	case "instance":
		ev.Instance, err = d.label(key)
	case "tenant":
		ev.Tenant, err = d.label(key)
	case "provider":
		ev.Provider, err = d.label(key)
	case "layer":
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.Layer, err = toLayer(s)
		}
	case "trace_id":
		ev.TraceID, err = d.strValue(key)
	case "error_code":
		ev.ErrorCode, err = d.label(key)
	case "conversation_id":
		ev.ConversationID, err = d.strValue(key)
	case "status":
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.Status = toStatus(s)
		}
	case "outcome":
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.Outcome = toOutcome(s)
		}
	case "input_tokens":
		ev.InputTokens, err = d.integer(key)
		*seen |= seenInput
	case "output_tokens":
		ev.OutputTokens, err = d.integer(key)
		*seen |= seenOutput
	case "cached_input_tokens":
		ev.CachedInputTokens, err = d.integer(key)
	case "ttft_ms":
		ev.TTFTMs, err = d.float(key)
		*seen |= seenTTFT
	case "total_ms":
		ev.TotalMs, err = d.float(key)
		*seen |= seenTotal
	case "max_itl_ms":
		ev.MaxITLMs, err = d.float(key)
	case "queue_ms":
		ev.QueueMs, err = d.float(key)
	case "prefill_ms":
		ev.PrefillMs, err = d.float(key)
	case "decode_ms":
		ev.DecodeMs, err = d.float(key)
	case "stream":
		ev.Stream, err = d.boolean(key)
	case "tokens_estimated":
		ev.TokensEstimated, err = d.boolean(key)
	case "http_status":
		var n int64
		n, err = d.integer(key)
		ev.HTTPStatus = int(n)
	case "turn":
		var n int64
		n, err = d.integer(key)
		ev.Turn = int(n)
	case "scores":
		ev.Scores, err = d.scores(key)
	default:
		err = d.skip(0)
	}
	return err
}

// scores reads the scores object: name to number or true/false, at most MaxScores names,
// the last of a repeated name winning. They are gathered on the stack and copied into one
// slice, so an event without scores costs nothing and one with scores one allocation.
func (d *decodeState) scores(field string) ([]Score, error) {
	if !d.take('{') {
		if err := d.skip(0); err != nil {
			return nil, err
		}
		return nil, fieldErr(field, ErrWrongType, "want an object of name to number")
	}
	var buf [MaxScores]Score
	n := 0
	d.ws()
	if !d.take('}') {
		for {
			d.ws()
			name, err := d.str()
			if err != nil {
				return nil, err
			}
			d.ws()
			if !d.take(':') {
				return nil, d.syntax("expected ':' after object key")
			}
			d.ws()
			var v float64
			switch {
			case d.literal("true"):
				v = 1
			case d.literal("false"):
				v = 0
			case d.i < len(d.s) && (d.s[d.i] == '-' || ('0' <= d.s[d.i] && d.s[d.i] <= '9')):
				if v, err = d.float(field); err != nil {
					if fe, ok := err.(*FieldError); ok {
						// Which score, as Validate names it; a name Validate would refuse
						// is quoted and bounded, as any other value from a client.
						if checkFeedbackName(field, name) == nil {
							fe.Field = field + "." + name
						} else {
							fe.Detail = quoteBounded(name) + ": " + fe.Detail
						}
					}
					return nil, err
				}
			default:
				if err := d.skip(0); err != nil {
					return nil, err
				}
				return nil, fieldErr(field, ErrWrongType, quoteBounded(name)+": want a number or true/false")
			}
			if dec := d.dec; dec != nil {
				name = dec.intern(name)
			}
			i := 0
			for i < n && buf[i].Name != name {
				i++
			}
			if i == n {
				if n == MaxScores {
					return nil, fieldErr(field, ErrOutOfRange, "more than "+strconv.Itoa(MaxScores)+" scores")
				}
				n++
			}
			buf[i] = Score{Name: name, Value: v}
			d.ws()
			if d.take(',') {
				continue
			}
			if d.take('}') {
				break
			}
			return nil, d.syntax("expected ',' or '}' in object")
		}
	}
	if n == 0 {
		return nil, nil
	}
	return append([]Score(nil), buf[:n]...), nil
}

func toStatus(s string) Status {
	switch s {
	case "ok":
		return StatusOK
	case "error":
		return StatusError
	case "timeout":
		return StatusTimeout
	case "canceled":
		return StatusCanceled
	}
	return Status(s)
}

// toLayer returns the layer s names without allocating. Validate rejects a value that is not
// a layer; an empty one is rejected here, since Validate reads an empty layer as gateway.
func toLayer(s string) (Layer, error) {
	switch s {
	case "gateway":
		return LayerGateway, nil
	case "engine":
		return LayerEngine, nil
	case "app":
		return LayerApp, nil
	case "":
		return "", fieldErr("layer", ErrUnknownStatus, `""`)
	}
	return Layer(s), nil
}

func toOutcome(s string) Outcome {
	switch s {
	case "completed":
		return OutcomeCompleted
	case "abandoned":
		return OutcomeAbandoned
	}
	return Outcome(s)
}

func parseTS(field, s string) (time.Time, error) {
	if t, ok := parseUTCMillis(s); ok {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fieldErr(field, ErrBadTimestamp, quoteBounded(s))
	}
	return t.UTC(), nil
}

func (d *decodeState) syntax(msg string) error { return &SyntaxError{Offset: d.i, Msg: msg} }

func (d *decodeState) ws() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decodeState) take(c byte) bool {
	if d.i < len(d.s) && d.s[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *decodeState) literal(lit string) bool {
	if strings.HasPrefix(d.s[d.i:], lit) {
		d.i += len(lit)
		return true
	}
	return false
}

func (d *decodeState) null() bool { return d.literal("null") }

func (d *decodeState) label(field string) (string, error) {
	s, err := d.strValue(field)
	if err != nil || d.dec == nil {
		return s, err
	}
	return d.dec.intern(s), nil
}

func (d *decodeState) strValue(field string) (string, error) {
	if d.i >= len(d.s) || d.s[d.i] != '"' {
		if err := d.skip(0); err != nil {
			return "", err
		}
		return "", fieldErr(field, ErrWrongType, "want a string")
	}
	return d.str()
}

// str reads a JSON string at d.i. Without escapes the result is a substring of the input.
func (d *decodeState) str() (string, error) {
	if !d.take('"') {
		return "", d.syntax("expected a string")
	}
	start := d.i
	// Keys and labels are short: a plain loop beats IndexByte's set-up for them.
	for i := start; i < len(d.s) && i < start+24; i++ {
		switch c := d.s[i]; {
		case c == '"':
			d.i = i + 1
			return d.s[start:i], nil
		case c == '\\':
			d.i = i
			return d.unescape(start)
		case c < 0x20:
			d.i = i
			return "", d.syntax("control character in string")
		}
	}
	end := strings.IndexByte(d.s[start:], '"')
	if end < 0 {
		return "", d.syntax("unterminated string")
	}
	seg := d.s[start : start+end]
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; c < 0x20 || c == '\\' {
			d.i = start + i
			if c == '\\' {
				return d.unescape(start)
			}
			return "", d.syntax("control character in string")
		}
	}
	d.i = start + end + 1
	return seg, nil
}

func (d *decodeState) unescape(start int) (string, error) {
	buf := make([]byte, 0, d.i-start+16)
	buf = append(buf, d.s[start:d.i]...)
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return string(buf), nil
		case c < 0x20:
			return "", d.syntax("control character in string")
		case c != '\\':
			buf = append(buf, c)
			d.i++
			continue
		}
		d.i++
		if d.i >= len(d.s) {
			break
		}
		e := d.s[d.i]
		d.i++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return "", d.syntax("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if strings.HasPrefix(d.s[d.i:], `\u`) {
					save := d.i
					d.i += 2
					var ok2 bool
					if r2, ok2 = d.hex4(); !ok2 {
						return "", d.syntax("bad \\u escape")
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						buf = utf8.AppendRune(buf, dec)
						continue
					}
					d.i = save
				}
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", d.syntax("bad escape in string")
		}
	}
	return "", d.syntax("unterminated string")
}

func (d *decodeState) hex4() (rune, bool) {
	if d.i+4 > len(d.s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(d.s[d.i : d.i+4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	d.i += 4
	return r, true
}

// number reads a JSON number and returns its text.
func (d *decodeState) number() (string, bool) {
	start := d.i
	s := d.s
	i := d.i
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
	default:
		return "", false
	}
	if i < len(s) && s[i] == '.' {
		i++
		j := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == j {
			return "", false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == j {
			return "", false
		}
	}
	d.i = i
	return s[start:i], true
}

func (d *decodeState) numberField(field string) (string, error) {
	if d.i < len(d.s) && (d.s[d.i] == '-' || ('0' <= d.s[d.i] && d.s[d.i] <= '9')) {
		if num, ok := d.number(); ok {
			return num, nil
		}
		return "", d.syntax("bad number")
	}
	if err := d.skip(0); err != nil {
		return "", err
	}
	return "", fieldErr(field, ErrWrongType, "want a number")
}

func (d *decodeState) integer(field string) (int64, error) {
	num, err := d.numberField(field)
	if err != nil {
		return 0, err
	}
	if len(num) <= 18 {
		neg := num[0] == '-'
		var n int64
		plain := true
		for _, c := range []byte(num[b2i(neg):]) {
			if c < '0' || c > '9' {
				plain = false
				break
			}
			n = n*10 + int64(c-'0')
		}
		if plain {
			if neg {
				n = -n
			}
			return n, nil
		}
	}
	f, perr := strconv.ParseFloat(num, 64)
	if perr != nil || f != float64(int64(f)) || f > 1<<62 || f < -(1<<62) {
		return 0, fieldErr(field, ErrOutOfRange, "want an integer, got "+quoteBounded(num))
	}
	return int64(f), nil
}

func (d *decodeState) float(field string) (float64, error) {
	num, err := d.numberField(field)
	if err != nil {
		return 0, err
	}
	if f, ok := fastFloat(num); ok {
		return f, nil
	}
	f, perr := strconv.ParseFloat(num, 64)
	if perr != nil {
		return 0, fieldErr(field, ErrOutOfRange, quoteBounded(num))
	}
	return f, nil
}

// pow10 holds the powers of ten a float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// fastFloat parses a plain decimal (no exponent) of at most 15 significant digits, the form
// latencies take, exactly: the digits and the power of ten are both exact in a float64, so
// one division rounds correctly (Clinger's fast path). Anything else is left to ParseFloat.
func fastFloat(num string) (float64, bool) {
	neg := false
	if num[0] == '-' {
		neg, num = true, num[1:]
	}
	var mant uint64
	digits, frac := 0, -1
	for i := 0; i < len(num); i++ {
		c := num[i]
		switch {
		case c >= '0' && c <= '9':
			if mant != 0 || c != '0' {
				digits++
			}
			mant = mant*10 + uint64(c-'0')
			if frac >= 0 {
				frac++
			}
		case c == '.' && frac < 0:
			frac = 0
		default:
			return 0, false
		}
		if digits > 15 || frac > 15 {
			return 0, false
		}
	}
	f := float64(mant)
	if frac > 0 {
		f /= pow10[frac]
	}
	if neg {
		f = -f
	}
	return f, true
}

func (d *decodeState) boolean(field string) (bool, error) {
	switch {
	case d.literal("true"):
		return true, nil
	case d.literal("false"):
		return false, nil
	}
	if err := d.skip(0); err != nil {
		return false, err
	}
	return false, fieldErr(field, ErrWrongType, "want true or false")
}

// skip reads over one JSON value of any kind, checking its syntax.
func (d *decodeState) skip(depth int) error {
	if depth > maxDepth {
		return d.syntax("nested too deeply")
	}
	d.ws()
	if d.i >= len(d.s) {
		return d.syntax("unexpected end of input")
	}
	switch c := d.s[d.i]; {
	case c == '{':
		d.i++
		d.ws()
		if d.take('}') {
			return nil
		}
		for {
			d.ws()
			if err := d.skipString(); err != nil {
				return err
			}
			d.ws()
			if !d.take(':') {
				return d.syntax("expected ':' after object key")
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			d.ws()
			if d.take(',') {
				continue
			}
			if d.take('}') {
				return nil
			}
			return d.syntax("expected ',' or '}' in object")
		}
	case c == '[':
		d.i++
		d.ws()
		if d.take(']') {
			return nil
		}
		for {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			d.ws()
			if d.take(',') {
				continue
			}
			if d.take(']') {
				return nil
			}
			return d.syntax("expected ',' or ']' in array")
		}
	case c == '"':
		return d.skipString()
	case c == 't':
		if d.literal("true") {
			return nil
		}
	case c == 'f':
		if d.literal("false") {
			return nil
		}
	case c == 'n':
		if d.null() {
			return nil
		}
	case c == '-' || ('0' <= c && c <= '9'):
		if _, ok := d.number(); ok {
			return nil
		}
		return d.syntax("bad number")
	}
	return d.syntax("unexpected character")
}

func (d *decodeState) skipString() error {
	if !d.take('"') {
		return d.syntax("expected a string")
	}
	for d.i < len(d.s) {
		c := d.s[d.i]
		d.i++
		switch {
		case c == '"':
			return nil
		case c < 0x20:
			return d.syntax("control character in string")
		case c == '\\':
			if d.i >= len(d.s) {
				return d.syntax("unterminated string")
			}
			e := d.s[d.i]
			d.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := d.hex4(); !ok {
					return d.syntax("bad \\u escape")
				}
			default:
				return d.syntax("bad escape in string")
			}
		}
	}
	return d.syntax("unterminated string")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// parseUTCMillis parses the form every tokenscope writer uses, 2006-01-02T15:04:05.000Z (or
// without the fraction), about ten times faster than time.Parse. Anything else — offsets,
// other precisions, invalid dates — is left to time.Parse.
func parseUTCMillis(s string) (time.Time, bool) {
	if (len(s) != 24 && len(s) != 20) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	num := func(i, n int) (int, bool) {
		v := 0
		for _, c := range []byte(s[i : i+n]) {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 2)
	day, ok3 := num(8, 2)
	hour, ok4 := num(11, 2)
	minute, ok5 := num(14, 2)
	sec, ok6 := num(17, 2)
	ms, ok7 := 0, true
	if len(s) == 24 {
		if s[19] != '.' {
			return time.Time{}, false
		}
		ms, ok7 = num(20, 3)
	}
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	if day > daysIn(time.Month(month), year) {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, ms*1e6, time.UTC), true
}

func daysIn(m time.Month, year int) int {
	switch m {
	case time.February:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}
