package bus

import (
	"strconv"
	"testing"
)

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

func TestRefusedForGood(t *testing.T) {
	f := func(ack string, want bool) {
		t.Helper()
		data := []byte(ack)
		at := jsonKey(data, "error")
		if at < 0 {
			t.Fatalf("no error in %s", ack)
		}
		if got := refusedForGood(data[at:]); got != want {
			t.Fatalf("refusedForGood(%s) = %v", ack, got)
		}
	}
	f(`{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"},"stream":"S"}`, true)
	f(`{"error":{"code":503,"err_code":10077,"description":"no resources"}}`, false)
	f(`{"error":{"code":429,"err_code":10184,"description":"too many requests"}}`, false)
	f(`{"error":{"code":500,"err_code":10077,"description":"store failed"}}`, false)
	f(`{"error":{"description":"no code"}}`, false)
}

func TestFIFO(t *testing.T) {
	var q, ready fifo
	next, want := 0, 0
	push := func(n int) {
		for range n {
			q.push(outMsg{id: strconv.Itoa(next)})
			next++
		}
	}
	pop := func(n int) {
		for range n {
			if got := ready.pop().id; got != strconv.Itoa(want) {
				t.Fatalf("popped %s, want %d", got, want)
			}
			want++
		}
	}
	// Moves into an empty, a partly popped and a just emptied fifo, across block edges.
	for _, step := range [][2]int{{3, 3}, {blockLen + 5, 2}, {blockLen, blockLen}, {1, blockLen + 4}, {2*blockLen + 1, 0}, {7, 2*blockLen + 8}} {
		push(step[0])
		q.moveTo(&ready)
		if q.len() != 0 || ready.len() != next-want {
			t.Fatalf("after move: queue %d, ready %d, want %d", q.len(), ready.len(), next-want)
		}
		pop(min(step[1], ready.len()))
	}
	pop(ready.len())
	if ready.len() != 0 || want != next {
		t.Fatalf("%d left", ready.len())
	}
	push(3)
	q.reset()
	if q.len() != 0 || len(q.blocks) != 0 {
		t.Fatal("reset left messages")
	}
}
