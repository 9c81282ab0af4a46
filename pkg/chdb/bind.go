package chdb

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Param is a query parameter: a {name:Type} placeholder, as current servers bind them
// (clickhouse-client --param_name, the HTTP interface's param_name).
type Param struct{ Name, Type string }

// ErrParam marks a parameter that is missing, of an unsupported type, or whose value does
// not read as its type.
var ErrParam = errors.New("bad query parameter")

var placeholderRE = regexp.MustCompile(`^\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([A-Za-z][A-Za-z0-9_]*(?:\([^{}()]*\))?)\s*\}`)

// Params returns the placeholders of sql in order of first use, each once. Placeholders in
// string literals, quoted identifiers and comments are not placeholders.
func Params(sql string) []Param {
	var out []Param
	seen := map[string]bool{}
	scan(sql, func(p Param, _ string) string {
		if !seen[p.Name] {
			seen[p.Name] = true
			out = append(out, p)
		}
		return ""
	})
	return out
}

// Bind fills in the placeholders of sql with values as literals of their types, for servers
// that cannot bind parameters themselves (ClickHouse before 19.15, such as Debian's 18.16).
// It answers what server-side binding answers:
//
//	String, FixedString(N)   a quoted string literal
//	UInt8…UInt64, Int8…Int64 an integer that fits the type
//	Float32, Float64         a number (nan, inf and -inf too)
//	Date                     2026-11-30
//	DateTime                 Unix seconds, "2026-11-30 10:00:00" (in the server's time zone,
//	                         as the server reads it), or RFC 3339
//
// A placeholder without a value, a type outside this list, or a value that does not read as
// its type is an ErrParam naming the parameter. Values no placeholder uses are ignored.
func Bind(sql string, values map[string]string) (string, error) {
	var firstErr error
	out := scan(sql, func(p Param, text string) string {
		v, ok := values[p.Name]
		var lit string
		var err error
		if !ok {
			err = fmt.Errorf("%w: no value for {%s:%s}", ErrParam, p.Name, p.Type)
		} else if lit, err = literal(p, v); err == nil {
			return lit
		}
		if firstErr == nil {
			firstErr = err
		}
		return text
	})
	if firstErr != nil {
		return "", firstErr
	}
	return out, nil
}

// literal renders v as a literal of p's type.
func literal(p Param, v string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s=%q is not a %s%s", ErrParam, p.Name, v, p.Type, why)
	}
	typ := p.Type
	if strings.HasPrefix(typ, "FixedString(") {
		typ = "String"
	}
	switch typ {
	case "String":
		return Quote(v), nil
	case "UInt8", "UInt16", "UInt32", "UInt64":
		bits, _ := strconv.Atoi(typ[4:])
		n, err := strconv.ParseUint(v, 10, bits)
		if err != nil {
			return "", bad("")
		}
		return strconv.FormatUint(n, 10), nil
	case "Int8", "Int16", "Int32", "Int64":
		bits, _ := strconv.Atoi(typ[3:])
		n, err := strconv.ParseInt(v, 10, bits)
		if err != nil {
			return "", bad("")
		}
		return strconv.FormatInt(n, 10), nil
	case "Float32", "Float64":
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return "", bad("")
		}
		switch {
		case math.IsNaN(f):
			return "nan", nil
		case math.IsInf(f, 1):
			return "inf", nil
		case math.IsInf(f, -1):
			return "-inf", nil
		}
		return strconv.FormatFloat(f, 'g', -1, 64), nil
	case "Date":
		if _, err := time.Parse("2006-01-02", v); err != nil {
			return "", bad(" (2026-11-30)")
		}
		return "toDate(" + Quote(v) + ")", nil
	case "DateTime":
		if n, err := strconv.ParseUint(v, 10, 32); err == nil {
			return fmt.Sprintf("toDateTime(%d)", n), nil
		}
		if _, err := time.Parse(time.DateTime, v); err == nil {
			return "toDateTime(" + Quote(v) + ")", nil
		}
		if t, err := time.Parse(time.RFC3339, v); err == nil && t.Unix() >= 0 && t.Unix() <= math.MaxUint32 {
			return fmt.Sprintf("toDateTime(%d)", t.Unix()), nil
		}
		return "", bad(" (Unix seconds, 2026-11-30 10:00:00 or RFC 3339)")
	}
	return "", fmt.Errorf("%w: {%s:%s}: only String, FixedString, [U]Int8–64, Float32/64, Date and DateTime parameters can be bound here", ErrParam, p.Name, p.Type)
}

var quoter = strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\x00", `\0`, "\n", `\n`, "\r", `\r`, "\t", `\t`)

// Quote returns s as a ClickHouse string literal.
func Quote(s string) string { return "'" + quoter.Replace(s) + "'" }

// scan copies sql, replacing each placeholder outside string literals, quoted identifiers
// and comments with what fill returns for it (fill gets the placeholder's text too).
func scan(sql string, fill func(p Param, text string) string) string {
	var b strings.Builder
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for j < len(sql) {
				if sql[j] == '\\' {
					j += 2
					continue
				}
				if sql[j] == c {
					if j+1 < len(sql) && sql[j+1] == c { // doubled quote
						j += 2
						continue
					}
					break
				}
				j++
			}
			j = min(j+1, len(sql))
			b.WriteString(sql[i:j])
			i = j
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				j = len(sql) - i
			}
			b.WriteString(sql[i : i+j])
			i += j
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			j := strings.Index(sql[i+2:], "*/")
			end := len(sql)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(sql[i:end])
			i = end
		case c == '{':
			if m := placeholderRE.FindStringSubmatch(sql[i:]); m != nil {
				b.WriteString(fill(Param{Name: m[1], Type: m[2]}, m[0]))
				i += len(m[0])
				continue
			}
			b.WriteByte(c)
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}
