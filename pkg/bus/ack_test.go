package bus

import "testing"

func TestJSONKey(t *testing.T) {
	f := func(data, key, wantValue string) {
		t.Helper()
		i := jsonKey([]byte(data), key)
		got := ""
		if i >= 0 {
			got = data[i:]
		}
		if got != wantValue {
			t.Fatalf("jsonKey(%s, %s) = %q, want %q", data, key, got, wantValue)
		}
	}
	f(`{"stream":"LLM_EVENTS","seq":7}`, "duplicate", "")
	f(`{"stream":"LLM_EVENTS","seq":7,"duplicate": true}`, "duplicate", "true}")
	f(`{"stream":"LLM_EVENTS","seq":7,"duplicate":true}`, "duplicate", "true}")
	f(`{"error":{"code":503,"err_code":10077,"description":"\"error\": no"},"stream":"S"}`, "error", `{"code":503,"err_code":10077,"description":"\"error\": no"},"stream":"S"}`)
	f(`{"stream":"error","seq":1}`, "error", "")
	f(`{"domain":"duplicate" ,"duplicate" : true}`, "duplicate", "true}")
	if isTrue([]byte(`{"duplicate":false}`), jsonKey([]byte(`{"duplicate":false}`), "duplicate")) {
		t.Fatal("false read as true")
	}
}
