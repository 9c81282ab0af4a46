package reqbody

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRead(t *testing.T) {
	const limit = 300 << 10
	body := func(n int) string { return strings.Repeat("b", n) }
	broken := errors.New("connection reset")
	for _, tc := range []struct {
		name     string
		r        io.Reader
		declared int64
		budget   int64
		want     int   // bytes returned
		wantHeld int64 // of the budget
		wantErr  error
	}{
		{"declared, one chunk", strings.NewReader(body(1000)), 1000, limit, 1000, 1000, nil},
		{"declared, empty", strings.NewReader(""), 0, limit, 0, 0, nil},
		{"declared, grows to its length", iotest.OneByteReader(strings.NewReader(body(200 << 10))), 200 << 10, limit, 200 << 10, 200 << 10, nil},
		{"declared, at the limit", strings.NewReader(body(limit)), limit, limit, limit, limit, nil},
		{"declared over the limit: not read", strings.NewReader(body(limit + 1)), limit + 1, limit, 0, 0, ErrTooLarge},
		{"declared large, little sent: holds what came", strings.NewReader(body(10)), limit, limit, 10, chunk, io.ErrUnexpectedEOF},
		{"shorter than declared", strings.NewReader(body(10)), 100, limit, 10, 100, io.ErrUnexpectedEOF},
		{"unknown length", strings.NewReader(body(1000)), -1, limit, 1000, chunk, nil},
		{"unknown length, grows", strings.NewReader(body(100 << 10)), -1, limit, 100 << 10, 2 * chunk, nil},
		{"unknown length, at the limit", strings.NewReader(body(limit)), -1, 2 * limit, limit, limit + 1, nil},
		{"unknown length, over the limit", strings.NewReader(body(limit + 10)), -1, 2 * limit, limit + 1, limit + 1, ErrTooLarge},
		{"budget full at once", strings.NewReader(body(1000)), 1000, 999, 0, 0, ErrBudgetFull},
		{"budget full as it grows", strings.NewReader(body(200 << 10)), 200 << 10, 100 << 10, chunk, chunk, ErrBudgetFull},
		{"read error", io.MultiReader(strings.NewReader(body(10)), iotest.ErrReader(broken)), 100, limit, 10, 100, broken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.budget, nil)
			buf, held, err := Read(tc.r, tc.declared, limit, b)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if len(buf) != tc.want || held != tc.wantHeld || b.Held() != held || int64(cap(buf)) != held {
				t.Fatalf("%d bytes in %d, holding %d (budget %d), want %d bytes holding %d", len(buf), cap(buf), held, b.Held(), tc.want, tc.wantHeld)
			}
			if !bytes.Equal(buf, bytes.Repeat([]byte("b"), len(buf))) {
				t.Fatal("the bytes read are not the body's")
			}
			b.Release(held)
			if b.Held() != 0 {
				t.Fatalf("%d held once released", b.Held())
			}
		})
	}
}

func TestBudget(t *testing.T) {
	b := NewBudget(100, nil)
	if !b.Reserve(60) || b.Reserve(41) || b.Held() != 60 {
		t.Fatalf("60 then 41 of 100: %d held", b.Held())
	}
	if !b.Reserve(40) || b.Held() != 100 {
		t.Fatalf("60 then 40 of 100: %d held", b.Held())
	}
	b.Release(100)
	if b.Held() != 0 {
		t.Fatalf("%d held once released", b.Held())
	}
}

// BenchmarkRead reads a 100 KiB body of declared length, growing from one chunk to it.
func BenchmarkRead(b *testing.B) {
	body := bytes.Repeat([]byte("b"), 100<<10)
	budget := NewBudget(DefaultLimit, nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		buf, held, err := Read(bytes.NewReader(body), int64(len(body)), 1<<20, budget)
		if err != nil || len(buf) != len(body) {
			b.Fatal(err)
		}
		budget.Release(held)
	}
}
