package report

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Answer is the result of any query: its columns and rows, each value as clickhouse-go
// scans it.
type Answer struct {
	Columns []string
	Types   []string
	Rows    [][]any
}

// maxAnswerRows bounds what a query may return to the terminal.
const maxAnswerRows = 100_000

// Run runs sql (its parameters already bound) and reads its answer, at most 100,000 rows.
func Run(ctx context.Context, conn driver.Conn, sql string) (Answer, error) {
	var a Answer
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return a, fmt.Errorf("cannot run the query: %w", err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	for _, ct := range types {
		a.Columns = append(a.Columns, ct.Name())
		a.Types = append(a.Types, ct.DatabaseTypeName())
	}
	for rows.Next() {
		if len(a.Rows) == maxAnswerRows {
			return a, fmt.Errorf("the query returns more than %d rows: add a LIMIT", maxAnswerRows)
		}
		ptrs := make([]any, len(types))
		for i, ct := range types {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			return a, fmt.Errorf("cannot read a row: %w", err)
		}
		row := make([]any, len(ptrs))
		for i, p := range ptrs {
			row[i] = reflect.ValueOf(p).Elem().Interface()
		}
		a.Rows = append(a.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return a, fmt.Errorf("cannot read the answer: %w", err)
	}
	return a, nil
}

// cell formats one value for a table: times in UTC, floats in the shortest exact form.
func cell(v any) string {
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.DateTime)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case string:
		return Text(x)
	case nil:
		return "NULL"
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "NULL"
		}
		return cell(rv.Elem().Interface())
	}
	if rv.Kind() == reflect.Slice {
		parts := make([]string, rv.Len())
		for i := range parts {
			parts[i] = cell(rv.Index(i).Interface())
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return fmt.Sprint(v)
}

// WriteAnswer writes a as aligned text, one line per row under a line of column names.
func WriteAnswer(w io.Writer, a Answer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(a.Columns, "\t")+"\t")
	for _, r := range a.Rows {
		cells := make([]string, len(r))
		for i, v := range r {
			cells[i] = cell(v)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the answer: %w", err)
	}
	_, err := fmt.Fprintf(w, "%d rows\n", len(a.Rows))
	return err
}

// JSON returns a's rows as objects keyed by column name; nan and ±inf, which JSON cannot
// hold, become null.
func (a Answer) JSON() []map[string]any {
	out := make([]map[string]any, len(a.Rows))
	for i, r := range a.Rows {
		m := make(map[string]any, len(r))
		for j, v := range r {
			m[a.Columns[j]] = jsonValue(v)
		}
		out[i] = m
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil
		}
	case time.Time:
		return x.UTC()
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Slice && rv.Type().Elem().Kind() != reflect.Uint8 {
		xs := make([]any, rv.Len())
		for i := range xs {
			xs[i] = jsonValue(rv.Index(i).Interface())
		}
		return xs
	}
	if _, err := json.Marshal(v); err != nil {
		return fmt.Sprint(v)
	}
	return v
}
