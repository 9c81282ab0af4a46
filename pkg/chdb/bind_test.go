package chdb_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

func TestBind(t *testing.T) {
	vals := map[string]string{"from": "1764579600", "at": "2026-11-30 10:00:00", "rfc": "2026-11-30T10:00:00Z", "model": `q'w\en`,
		"limit": "1000", "neg": "-5", "f": "0.25", "day": "2026-11-30", "big": "300", "unused": "x"}
	for _, tc := range []struct {
		name, sql, want string
		wantErr         error
	}{
		{"datetime unix", "ts >= {from:DateTime}", "ts >= toDateTime(1764579600)", nil},
		{"datetime text", "ts >= {at:DateTime}", "ts >= toDateTime('2026-11-30 10:00:00')", nil},
		{"datetime rfc3339", "ts >= {rfc:DateTime}", "ts >= toDateTime(1796032800)", nil},
		{"string quoted", "model = {model:String}", `model = 'q\'w\\en'`, nil},
		{"spaces and repeats", "{ limit : UInt32 } + {limit:UInt32}", "1000 + 1000", nil},
		{"signed", "{neg:Int64}", "-5", nil},
		{"float", "{f:Float64}", "0.25", nil},
		{"date", "{day:Date}", "toDate('2026-11-30')", nil},
		{"not in literals or comments", "SELECT '{from:DateTime}', `{x:String}` -- {from:DateTime}\n/* {y:UInt8} */ {from:DateTime}", "SELECT '{from:DateTime}', `{x:String}` -- {from:DateTime}\n/* {y:UInt8} */ toDateTime(1764579600)", nil},
		{"escaped quote in literal", `SELECT 'it\'s {from:DateTime}', {limit:UInt32}`, `SELECT 'it\'s {from:DateTime}', 1000`, nil},
		{"braces that are not placeholders", "SELECT {'a': 1}, map{}", "SELECT {'a': 1}, map{}", nil},
		{"missing", "{nope:String}", "", chdb.ErrParam},
		{"out of range", "{big:UInt8}", "", chdb.ErrParam},
		{"not a number", "{model:UInt32}", "", chdb.ErrParam},
		{"bad time", "{model:DateTime}", "", chdb.ErrParam},
		{"unsupported type", "{model:Array(String)}", "", chdb.ErrParam},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chdb.Bind(tc.sql, vals)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("Bind(%q) = %q, %v; want %q, %v", tc.sql, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParams(t *testing.T) {
	got := chdb.Params("WHERE a >= {from:DateTime} AND a < {to:DateTime} AND m = {model:String} -- {x:UInt8}\nAND b >= {from:DateTime} LIMIT {limit:UInt32}")
	want := []chdb.Param{{"from", "DateTime"}, {"to", "DateTime"}, {"model", "String"}, {"limit", "UInt32"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v", got)
	}
}

func TestQuote(t *testing.T) {
	if got := chdb.Quote("a'b\\c\x00\n"); got != `'a\'b\\c\0\n'` {
		t.Fatalf("got %s", got)
	}
}
