package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Result is a query's answer in a form in which the answers of two servers compare: every
// value is a uint64, int64, float64, string, time.Time (UTC), []any of those, or nil.
type Result struct {
	Columns []Column
	Rows    [][]any
}

// Column is a result column: its name and its type as the server names it.
type Column struct{ Name, Type string }

// Query runs sql on a server through clickhouse-go and returns its answer as a Result.
func Query(ctx context.Context, conn driver.Conn, sql string, args ...any) (*Result, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	res := &Result{Rows: [][]any{}}
	for _, ct := range types {
		res.Columns = append(res.Columns, Column{Name: ct.Name(), Type: ct.DatabaseTypeName()})
	}
	for rows.Next() {
		ptrs := make([]any, len(types))
		for i, ct := range types {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([]any, len(ptrs))
		for i, p := range ptrs {
			row[i] = normalize(reflect.ValueOf(p).Elem())
		}
		res.Rows = append(res.Rows, row)
	}
	return res, rows.Err()
}

func normalize(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return normalize(v.Elem())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return v.Uint()
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return v.Int()
	case reflect.Float32:
		// The shortest decimal that reads back as this float32, as the server prints it.
		f, _ := strconv.ParseFloat(strconv.FormatFloat(v.Float(), 'g', -1, 32), 64)
		return f
	case reflect.Float64:
		return v.Float()
	case reflect.String:
		return v.String()
	case reflect.Bool:
		if v.Bool() {
			return uint64(1)
		}
		return uint64(0)
	case reflect.Slice, reflect.Array:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = normalize(v.Index(i))
		}
		return out
	}
	if t, ok := v.Interface().(time.Time); ok {
		return t.UTC()
	}
	return fmt.Sprintf("%v", v.Interface())
}

// parseJSONCompact reads what a server prints in the JSONCompact format.
func parseJSONCompact(out string) (*Result, error) {
	var doc struct {
		Meta []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"meta"`
		Data [][]any `json:"data"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("cannot read the JSONCompact answer: %w", err)
	}
	res := &Result{Rows: [][]any{}}
	for _, m := range doc.Meta {
		res.Columns = append(res.Columns, Column{Name: m.Name, Type: m.Type})
	}
	for _, raw := range doc.Data {
		if len(raw) != len(res.Columns) {
			return nil, fmt.Errorf("a row of %d values for %d columns", len(raw), len(res.Columns))
		}
		row := make([]any, len(raw))
		for i, v := range raw {
			x, err := fromJSON(res.Columns[i].Type, v)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", res.Columns[i].Name, err)
			}
			row[i] = x
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// unwrap returns the type inside wrapper(…), or t when t is not one.
func unwrap(t, wrapper string) (string, bool) {
	if strings.HasPrefix(t, wrapper+"(") && strings.HasSuffix(t, ")") {
		return t[len(wrapper)+1 : len(t)-1], true
	}
	return t, false
}

func fromJSON(typ string, v any) (any, error) {
	typ, _ = unwrap(typ, "LowCardinality")
	typ, nullable := unwrap(typ, "Nullable")
	if v == nil {
		if nullable {
			return nil, nil
		}
		return nil, fmt.Errorf("null in a %s column", typ)
	}
	if inner, ok := unwrap(typ, "Array"); ok {
		xs, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%v is not an array", v)
		}
		out := make([]any, len(xs))
		for i, x := range xs {
			var err error
			if out[i], err = fromJSON(inner, x); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	text := fmt.Sprint(v)
	switch {
	case strings.HasPrefix(typ, "UInt"):
		return strconv.ParseUint(text, 10, 64)
	case strings.HasPrefix(typ, "Int"):
		return strconv.ParseInt(text, 10, 64)
	case strings.HasPrefix(typ, "Float"):
		if text == "-nan" || text == "+nan" {
			return math.NaN(), nil
		}
		return strconv.ParseFloat(text, 64)
	case typ == "Bool":
		if text == "true" {
			return uint64(1), nil
		}
		return uint64(0), nil
	case strings.HasPrefix(typ, "DateTime"), typ == "Date", typ == "Date32":
		return parseTime(typ, text)
	}
	return text, nil
}

var tzRE = strings.NewReplacer(" ", "")

// parseTime reads a DateTime, DateTime64 or Date as printed in the column's time zone, or
// in the local one (the engine's, which it takes from the environment as Go does).
func parseTime(typ, text string) (time.Time, error) {
	loc := time.Local
	if i := strings.IndexByte(typ, '\''); i >= 0 {
		name := strings.Trim(tzRE.Replace(typ[i:]), "')")
		l, err := time.LoadLocation(name)
		if err != nil {
			return time.Time{}, err
		}
		loc = l
	}
	layout := "2006-01-02 15:04:05"
	if typ == "Date" || typ == "Date32" {
		layout = "2006-01-02"
	}
	if strings.Contains(text, ".") {
		layout += ".999999999"
	}
	t, err := time.ParseInLocation(layout, text, loc)
	return t.UTC(), err
}

// sameType reports whether two servers' names of a result column's type are the same type,
// LowCardinality aside, and DateTime64 (where a current server stores milliseconds) taken
// as DateTime.
func sameType(a, b string) bool {
	canon := func(t string) string {
		t, _ = unwrap(t, "LowCardinality")
		if strings.HasPrefix(t, "DateTime") {
			return "DateTime"
		}
		return t
	}
	return canon(a) == canon(b)
}

// Compare reports how got differs from want: column names, column types (see sameType),
// the number of rows and every value, floats within the relative tolerance tol, except the
// values of the columns named in skip (which the caller checks otherwise: t-digest
// quantiles, which current servers read off the centroids differently from 18.16).
func Compare(want, got *Result, tol float64, skip ...string) error {
	var diffs []string
	add := func(format string, args ...any) {
		if len(diffs) < 20 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	if len(want.Columns) != len(got.Columns) {
		add("%d columns, want %d (%v, want %v)", len(got.Columns), len(want.Columns), got.Columns, want.Columns)
	} else {
		for i := range want.Columns {
			if w, g := want.Columns[i], got.Columns[i]; w.Name != g.Name || !sameType(w.Type, g.Type) {
				add("column %d is %s %s, want %s %s", i+1, g.Name, g.Type, w.Name, w.Type)
			}
		}
	}
	if len(want.Rows) != len(got.Rows) {
		add("%d rows, want %d", len(got.Rows), len(want.Rows))
	}
	for r := range min(len(want.Rows), len(got.Rows)) {
		for c := range min(len(want.Rows[r]), len(got.Rows[r])) {
			if c < len(want.Columns) && slices.Contains(skip, want.Columns[c].Name) {
				continue
			}
			if !sameValue(want.Rows[r][c], got.Rows[r][c], tol) {
				name := ""
				if c < len(want.Columns) {
					name = want.Columns[c].Name
				}
				add("row %d, %s: %v, want %v", r+1, name, got.Rows[r][c], want.Rows[r][c])
			}
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(diffs, "; "))
}

func sameValue(a, b any, tol float64) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		if !ok {
			return false
		}
		if math.IsNaN(x) || math.IsNaN(y) {
			return math.IsNaN(x) && math.IsNaN(y)
		}
		if x == y {
			return true
		}
		return math.Abs(x-y) <= tol*math.Max(math.Abs(x), math.Abs(y))
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i], tol) {
				return false
			}
		}
		return true
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	}
	return reflect.DeepEqual(a, b)
}

// CopyTables copies every row of tables from the database db on a server (through
// clickhouse-go) into the same tables on c, which must exist there with the same columns
// or more. Times travel in UTC, so neither server's time zone matters.
func CopyTables(ctx context.Context, conn driver.Conn, db string, c *Current, tables ...string) error {
	for _, table := range tables {
		desc, err := Query(ctx, conn, "DESCRIBE TABLE "+db+"."+table)
		if err != nil {
			return fmt.Errorf("cannot describe %s: %w", table, err)
		}
		var names []string
		for _, r := range desc.Rows {
			names = append(names, r[0].(string))
		}
		res, err := Query(ctx, conn, "SELECT "+strings.Join(names, ", ")+" FROM "+db+"."+table)
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", table, err)
		}
		head := "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ") " + tsvInsert
		for start := 0; start < len(res.Rows); start += 500 {
			var b bytes.Buffer
			b.WriteString(head)
			for _, row := range res.Rows[start:min(start+500, len(res.Rows))] {
				for i, v := range row {
					if i > 0 {
						b.WriteByte('\t')
					}
					writeTSV(&b, v, false)
				}
				b.WriteByte('\n')
			}
			if err := c.Exec(ctx, b.String()); err != nil {
				return fmt.Errorf("cannot copy %s: %w", table, err)
			}
		}
	}
	return nil
}

// tsvInsert ends an INSERT of rows written by writeTSV: times are RFC 3339 in UTC, which
// the best-effort parser reads whatever the server's time zone.
const tsvInsert = "SETTINGS date_time_input_format = 'best_effort' FORMAT TabSeparated\n"

var tsvEscaper = strings.NewReplacer(`\`, `\\`, "\t", `\t`, "\n", `\n`, "\r", `\r`, "\x00", `\0`, "'", `\'`)

func writeTSV(b *bytes.Buffer, v any, inArray bool) {
	switch x := v.(type) {
	case nil:
		b.WriteString(`\N`)
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("nan")
		case math.IsInf(x, 1):
			b.WriteString("inf")
		case math.IsInf(x, -1):
			b.WriteString("-inf")
		default:
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case string:
		if inArray {
			b.WriteByte('\'')
		}
		b.WriteString(tsvEscaper.Replace(x))
		if inArray {
			b.WriteByte('\'')
		}
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeTSV(b, e, true)
		}
		b.WriteByte(']')
	case time.Time:
		if inArray {
			b.WriteByte('\'')
		}
		b.WriteString(x.UTC().Format("2006-01-02T15:04:05.999999999Z"))
		if inArray {
			b.WriteByte('\'')
		}
	default:
		fmt.Fprint(b, x)
	}
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return tail(s.b.String())
}
