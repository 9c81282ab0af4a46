package meter

import (
	"bytes"
	"encoding/binary"
	"time"
)

// A Responses event past the meter's limit is read as it passes, without being kept: its
// response.completed repeats the whole output, so it is as long as the answer, and an image
// the image_generation tool streams comes in events of a MiB and more. bigEvent follows the
// event's lines and checks, byte by byte, that its data is one JSON object, as the decoder
// would accept it; of it, it keeps only the members the meter reads of such an event, each
// up to bigValueMax: the top-level type, error and code, and, in the top-level response
// object, its usage, status and error. A "usage" inside the output is text or an item's
// member, at another depth, and is never taken for the response's own.

// bigValueMax bounds each member value bigEvent keeps: a usage object is a few hundred bytes.
const bigValueMax = 4 << 10

// bigNameMax bounds the event: line bigEvent keeps: the API's names are under 64 bytes.
const bigNameMax = 256

// JSON scanner states.
const (
	jValue   uint8 = iota // a value comes next
	jFirst                // just inside a bracket: its closing, or its first member or element
	jName                 // a member name comes next
	jColon                // a colon comes next
	jAfter                // a value ended: a comma or a closing bracket comes next
	jString               // inside a string
	jLiteral              // inside true, false or null
	jNumber               // inside a number
	jEnd                  // the object ended: only white space may follow
	jBad                  // not JSON
)

// Number states, as JSON's grammar has them.
const (
	nSign  uint8 = iota // after '-': a digit comes next
	nZero               // a leading 0: the number may end
	nInt                // integer digits: the number may end
	nDot                // after '.': a digit comes next
	nFrac               // fraction digits: the number may end
	nE                  // after 'e': a sign or a digit comes next
	nESign              // after the exponent's sign: a digit comes next
	nExp                // exponent digits: the number may end
)

// The members bigEvent reads.
type bigMember uint8

const (
	bmOther bigMember = iota
	bmType
	bmResponse
	bmError
	bmCode
	bmUsage
	bmStatus
)

// SSE line states.
const (
	lnField uint8 = iota // the field name is being read
	lnData               // a data: line's value
	lnName               // an event: line's value
	lnSkip               // another line
)

// maxNestingDepth is the deepest nesting encoding/json's Valid accepts.
const maxNestingDepth = 10000

type bigEvent struct {
	// The SSE lines.
	field    []byte // the line's field name so far, up to its colon
	lineKind uint8
	space    bool   // the space after the field's colon may come next
	name     []byte // the event: line's value
	nameLong bool
	nameTail []byte // the event: line's last bytes, as many as ".delta" has: a long one's kind
	dataN    int    // the data's bytes so far, the newlines between its lines included
	head     []byte // the data's first bytes, for the test the fast path makes
	types    int    // occurrences of `"type"` in the data, as bytes.Count counts them
	typeAt   int    // bytes of `"type"` matched so far

	// The JSON scanner.
	state, num uint8
	esc        uint8 // in a string: 1 after a backslash, 2 to 5 while a \u escape's digits come
	lit        string
	litAt      int
	depth      int // open brackets
	maxDepth   int
	escName    bool                           // a member name has an escape
	objects    [maxNestingDepth/64 + 1]uint64 // which open brackets are objects
	isName     bool
	key        []byte // the member name being read, quoted
	top, resp  bigMember
	inResp     bool // the top-level response object is open, at depth 2
	capturing  bool // a member value is being kept, in value
	capDone    bool
	capMember  bigMember
	capDepth   int
	capResp    bool // the member kept is the response object's
	value      []byte
	valueLong  bool

	// What was read, the last of a member given twice winning.
	invalid   bool // a member the decoder reads has a type it refuses: malformed
	typ       string
	typLong   bool
	perr      *providerError
	flat      providerError
	respKind  uint8 // 0 none, 1 null, 2 object
	usage     *reported
	usageLong bool
	respErr   *providerError
	failed    bool
}

// begin readies b for an event of which name and data were read before it went past the limit.
func (b *bigEvent) begin(name, data []byte) {
	*b = bigEvent{field: b.field[:0], name: b.name[:0], nameTail: b.nameTail[:0], head: b.head[:0], key: b.key[:0], value: kept(b.value)}
	b.setName(name)
	b.data(data)
}

func (b *bigEvent) setName(v []byte) {
	b.name, b.nameLong, b.nameTail = b.name[:0], len(v) > bigNameMax, b.nameTail[:0]
	if !b.nameLong {
		b.name = append(b.name, v...)
	}
	b.tail(v)
}

// tail keeps the last bytes of the event: line, v the next of them.
func (b *bigEvent) tail(v []byte) {
	const n = len(".delta")
	if len(v) >= n {
		b.nameTail = append(b.nameTail[:0], v[len(v)-n:]...)
		return
	}
	b.nameTail = append(b.nameTail, v...)
	if k := len(b.nameTail); k > n {
		copy(b.nameTail, b.nameTail[k-n:])
		b.nameTail = b.nameTail[:n]
	}
}

// line reads bytes of the event's current line, its line end left out.
func (b *bigEvent) line(p []byte) {
	for len(p) > 0 {
		switch b.lineKind {
		case lnField:
			c := p[0]
			p = p[1:]
			b.field = append(b.field, c)
			switch {
			case string(b.field) == "data:":
				b.lineKind, b.space = lnData, true
				if b.dataN > 0 {
					b.data([]byte{'\n'})
				}
			case string(b.field) == "event:":
				b.lineKind, b.space = lnName, true
				b.name, b.nameLong, b.nameTail = b.name[:0], false, b.nameTail[:0]
			case !bytes.HasPrefix([]byte("data:"), b.field) && !bytes.HasPrefix([]byte("event:"), b.field):
				b.lineKind = lnSkip
			}
		case lnData:
			if b.space && p[0] == ' ' {
				p = p[1:]
			}
			b.space = false
			b.data(p)
			return
		case lnName:
			if b.space && p[0] == ' ' {
				p = p[1:]
			}
			b.space = false
			if len(b.name)+len(p) > bigNameMax {
				b.name, b.nameLong = b.name[:0], true
			} else if !b.nameLong {
				b.name = append(b.name, p...)
			}
			b.tail(p)
			return
		default:
			return
		}
	}
}

// endLine ends the event's current line.
func (b *bigEvent) endLine() { b.field, b.lineKind, b.space = b.field[:0], lnField, false }

// data reads bytes of the event's data.
func (b *bigEvent) data(p []byte) {
	if room := 10 + bigNameMax - len(b.head); room > 0 {
		b.head = append(b.head, p[:min(room, len(p))]...)
	}
	b.dataN += len(p)
	for i := 0; i < len(p); {
		if b.state == jString && b.esc == 0 && !b.isName && !b.capturing {
			// The bulk of a long event: a run of a string's plain bytes.
			j := i + plainRun(p[i:])
			if j > i {
				// Past its first bytes, a run without a quote matches no part of `"type"`.
				for _, c := range p[i:min(j, i+5)] {
					b.countType(c)
				}
				if j-i > 5 {
					b.typeAt = 0
				}
				i = j
				continue
			}
		}
		b.countType(p[i])
		b.step(p[i])
		i++
	}
}

// plainRun is the length of the run of a string's plain bytes p begins with: up to a
// quote, a backslash or a control byte. It reads 8 bytes at a time: an image is the bulk
// of the longest events, and this loop the bulk of the time they take.
func plainRun(p []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	n := 0
	for ; n+8 <= len(p); n += 8 {
		x := binary.LittleEndian.Uint64(p[n:])
		quote, backslash := x^(ones*'"'), x^(ones*'\\')
		// A word has a byte below k when (x - ones*k) &^ x has a high bit set (k <= 0x80):
		// here a zero byte of quote or backslash (k = 1), or a control byte of x (k = 0x20).
		if ((quote-ones)&^quote|(backslash-ones)&^backslash|(x-ones*0x20)&^x)&highs != 0 {
			break
		}
	}
	for n < len(p) && p[n] != '"' && p[n] != '\\' && p[n] >= 0x20 {
		n++
	}
	return n
}

// countType counts `"type"` in the data, as bytes.Count does: the occurrences that do not
// overlap, from the left.
func (b *bigEvent) countType(c byte) {
	const pat = `"type"`
	switch {
	case c == pat[b.typeAt]:
		b.typeAt++
		if b.typeAt == len(pat) {
			b.types, b.typeAt = b.types+1, 0
		}
	case c == '"':
		b.typeAt = 1
	default:
		b.typeAt = 0
	}
}

// step reads one byte of the data's JSON.
func (b *bigEvent) step(c byte) {
	if b.scan(c) {
		// A number ended before c: so did the value kept, if it was the number.
		if b.capDone {
			b.endValue()
		}
		b.scan(c)
	}
	if b.capturing {
		if len(b.value) < bigValueMax {
			b.value = append(b.value, c)
		} else {
			b.valueLong = true
		}
		if b.capDone {
			b.endValue()
		}
	}
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (b *bigEvent) isObject() bool { return b.objects[(b.depth-1)/64]&(1<<((b.depth-1)%64)) != 0 }

// scan moves the scanner over c; again says that c ended a number and must be read after it.
func (b *bigEvent) scan(c byte) (again bool) {
	switch b.state {
	case jValue:
		if isWS(c) {
			return false
		}
		if b.depth == 0 && c != '{' {
			b.state = jBad
			return false
		}
		b.startValue(c)
		switch {
		case c == '{' || c == '[':
			if b.depth == maxNestingDepth {
				b.state = jBad
				return false
			}
			word, bit := b.depth/64, uint64(1)<<(b.depth%64)
			if c == '{' {
				b.objects[word] |= bit
			} else {
				b.objects[word] &^= bit
			}
			b.depth++
			b.maxDepth = max(b.maxDepth, b.depth)
			if c == '{' && b.depth == 2 && b.top == bmResponse {
				b.inResp, b.resp = true, bmOther
			}
			b.state = jFirst
		case c == '"':
			b.state, b.isName, b.esc = jString, false, 0
		case c == 't':
			b.state, b.lit, b.litAt = jLiteral, "true", 1
		case c == 'f':
			b.state, b.lit, b.litAt = jLiteral, "false", 1
		case c == 'n':
			b.state, b.lit, b.litAt = jLiteral, "null", 1
		case c == '-':
			b.state, b.num = jNumber, nSign
		case c == '0':
			b.state, b.num = jNumber, nZero
		case '1' <= c && c <= '9':
			b.state, b.num = jNumber, nInt
		default:
			b.state = jBad
		}
	case jFirst:
		switch {
		case isWS(c):
		case (c == '}' && b.isObject()) || (c == ']' && !b.isObject()):
			b.close()
		case b.isObject():
			b.state = jName
			return b.scan(c)
		default:
			b.state = jValue
			return b.scan(c)
		}
	case jName:
		switch {
		case isWS(c):
		case c == '"':
			b.state, b.isName, b.esc, b.key = jString, true, 0, append(b.key[:0], c)
		default:
			b.state = jBad
		}
	case jColon:
		switch {
		case isWS(c):
		case c == ':':
			b.state = jValue
		default:
			b.state = jBad
		}
	case jAfter:
		switch {
		case isWS(c):
		case c == ',' && b.isObject():
			b.state = jName
		case c == ',':
			b.state = jValue
		case (c == '}' && b.isObject()) || (c == ']' && !b.isObject()):
			b.close()
		default:
			b.state = jBad
		}
	case jString:
		if b.isName {
			if len(b.key) <= bigNameMax {
				b.key = append(b.key, c)
			}
		}
		switch {
		case b.esc == 1:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				b.esc = 0
			case 'u':
				b.esc = 2
			default:
				b.state = jBad
			}
		case b.esc > 1:
			if !isHex4([]byte{c}) {
				b.state = jBad
			} else if b.esc++; b.esc == 6 {
				b.esc = 0
			}
		case c == '\\':
			b.esc = 1
			b.escName = b.escName || b.isName
		case c < 0x20:
			b.state = jBad
		case c == '"':
			if b.isName {
				b.nameEnd()
				b.state = jColon
			} else {
				b.valueEnd()
			}
		}
	case jLiteral:
		if c != b.lit[b.litAt] {
			b.state = jBad
		} else if b.litAt++; b.litAt == len(b.lit) {
			b.valueEnd()
		}
	case jNumber:
		digit := '0' <= c && c <= '9'
		switch {
		case c == '0' && b.num == nSign:
			b.num = nZero
		case digit && (b.num == nSign || b.num == nInt):
			b.num = nInt
		case digit && (b.num == nDot || b.num == nFrac):
			b.num = nFrac
		case digit && (b.num == nE || b.num == nESign || b.num == nExp):
			b.num = nExp
		case c == '.' && (b.num == nZero || b.num == nInt):
			b.num = nDot
		case (c == 'e' || c == 'E') && (b.num == nZero || b.num == nInt || b.num == nFrac):
			b.num = nE
		case (c == '+' || c == '-') && b.num == nE:
			b.num = nESign
		case b.num == nZero || b.num == nInt || b.num == nFrac || b.num == nExp:
			b.valueEnd()
			return true
		default:
			b.state = jBad
		}
	case jEnd:
		if !isWS(c) {
			b.state = jBad
		}
	}
	return false
}

func (b *bigEvent) close() {
	b.depth--
	if b.depth == 1 {
		b.inResp = false
	}
	b.valueEnd()
}

// valueEnd: a value ended, c its last byte (or the byte after a number).
func (b *bigEvent) valueEnd() {
	b.state = jAfter
	if b.depth == 0 {
		b.state = jEnd
	}
	if b.capturing && b.depth == b.capDepth {
		b.capDone = true
	}
}

// nameEnd: the name of a member at b.depth was read.
func (b *bigEvent) nameEnd() {
	m := bmOther
	if len(b.key) <= bigNameMax {
		for _, k := range [...]struct {
			name string
			m    bigMember
		}{{"type", bmType}, {"response", bmResponse}, {"error", bmError}, {"code", bmCode}, {"usage", bmUsage}, {"status", bmStatus}} {
			if NameIs(b.key, k.name) {
				m = k.m
			}
		}
	}
	switch {
	case b.depth == 1:
		b.top = m
	case b.depth == 2 && b.inResp:
		b.resp = m
	}
}

// startValue: a value begins with c, at b.depth (the bracket it opens not yet counted).
func (b *bigEvent) startValue(c byte) {
	m, inResp := bmOther, false
	switch {
	case b.depth == 1:
		m = b.top
		if m == bmUsage || m == bmStatus {
			return // not the top level's
		}
		if m == bmResponse {
			// Another response object: the last one counts, whole.
			b.usage, b.usageLong, b.respErr, b.failed = nil, false, nil, false
			switch c {
			case '{':
				b.respKind = 2
			case 'n':
				b.respKind = 1
			default:
				b.invalid = true // the decoder reads it as an object
			}
			return
		}
	case b.depth == 2 && b.inResp:
		m, inResp = b.resp, true
		if m == bmType || m == bmResponse || m == bmCode {
			return // not the response object's
		}
	}
	if m == bmOther {
		return
	}
	b.capturing, b.capDone, b.capMember, b.capDepth, b.capResp = true, false, m, b.depth, inResp
	b.value, b.valueLong = b.value[:0], false
}

// endValue reads the member value kept, now whole, as the decoder reads it.
func (b *bigEvent) endValue() {
	b.capturing, b.capDone = false, false
	v, long := b.value, b.valueLong
	// A value too long to keep is read by its first byte: its type.
	isObject := v[0] == '{'
	ok := true
	switch {
	case b.capMember == bmType:
		b.typLong = long
		if long {
			ok = v[0] == '"'
		} else {
			b.typ, ok = text(v)
		}
	case b.capMember == bmCode:
		b.flat.code = ""
		if !long {
			ok = b.flat.read("code", v)
		}
	case b.capMember == bmError && !b.capResp:
		b.perr, ok = &providerError{}, isObject
		if !long {
			b.perr, ok = readError(v)
		}
	case b.capMember == bmError:
		b.respErr, ok = &providerError{}, isObject
		if !long {
			b.respErr, ok = readError(v)
		}
	case b.capMember == bmStatus:
		b.failed, ok = false, v[0] == '"'
		if !long {
			var s string
			s, ok = text(v)
			b.failed = s == "failed"
		}
	case b.capMember == bmUsage:
		b.usage, b.usageLong, ok = nil, long, isObject
		if !long {
			b.usage, ok = responsesUsage(v)
		}
	}
	if !ok {
		b.invalid = true
	}
}

// complete reports whether the data was one JSON object, whole.
func (b *bigEvent) complete() bool { return b.state == jEnd }

// fast reports whether the meter would read the event, were it short, by its name alone
// (responsesEvent's fast path).
func (b *bigEvent) fast() bool {
	name := b.name
	if len(name) == 0 || b.nameLong || terminalResponseEvent(name) || b.types != 1 || b.maxDepth > maxFastDepth || b.escName {
		return false
	}
	rest, ok := bytes.CutPrefix(b.head, []byte(`{"type":"`))
	return ok && bytes.HasPrefix(rest, name) && bytes.HasPrefix(rest[len(name):], []byte(`"`))
}

// bigStart begins reading the event being read, which went past the limit, as it passes:
// piece is its current line's next bytes, with the line's end when complete is set.
func (m *Meter) bigStart(piece []byte, complete bool) {
	if m.big == nil {
		m.big = new(bigEvent)
	}
	b := m.big
	b.begin(m.name, m.data)
	m.bigOn = true
	b.line(m.pending[m.lineAt:])
	if !complete {
		b.line(piece)
		return
	}
	i, _ := lineEnd(piece)
	b.line(piece[:i])
	b.endLine()
}

// bigEnd measures the event past the limit that just ended, as responsesEvent measures one.
func (m *Meter) bigEnd(now time.Time) {
	b := m.big
	m.bigOn = false
	defer func() { b.value = kept(b.value) }()
	if b.dataN == 0 {
		return
	}
	if b.complete() && b.fast() {
		if bytes.HasSuffix(b.name, []byte(".delta")) {
			m.content(now, b.dataN)
		}
		return
	}
	if b.dataN == len("[DONE]") && string(b.head) == "[DONE]" {
		return // not the API's, but some compatible servers end with it too
	}
	if !b.complete() || b.invalid {
		m.malformed++
		return
	}
	if b.typ == "" && b.nameLong {
		// No type, and a name too long to keep, none the API sends: the name is the type,
		// a delta by its end.
		if string(b.nameTail) == ".delta" {
			m.content(now, b.dataN)
		}
		return
	}
	if b.typLong {
		m.unread++ // an event of a type too long to keep: none the API sends
		return
	}
	typ := b.typ
	if typ == "" {
		typ = string(b.name)
	}
	switch {
	case typ == "response.completed" || typ == "response.incomplete" || typ == "response.failed":
		if b.respKind == 2 {
			m.response(&responseObject{usage: b.usage, err: b.respErr, failed: b.failed})
			if b.usageLong {
				m.unread++ // its usage could not be read: the tokens are estimated
			}
		}
		if typ == "response.failed" && m.errCode == "" {
			m.errCode = "upstream_error"
		}
		m.done = true
	case typ == "error":
		perr := b.perr
		if perr == nil {
			perr = &b.flat
		}
		m.errCode = perr.String()
	case len(typ) > len(".delta") && typ[len(typ)-len(".delta"):] == ".delta":
		m.content(now, b.dataN)
	}
}
