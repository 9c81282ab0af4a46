package events

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// CheckKeys returns an error wrapping ErrMalformed when data, the JSON of a v (a pointer to a
// struct of this package), has a key given twice or a field's key in other letter case; see
// checkKeys. For a consumer that decodes a message with encoding/json.
func CheckKeys(data []byte, v any) error { return checkKeys(data, reflect.TypeOf(v)) }

// checkKeys rejects what encoding/json would take silently in a message decoded into a t:
// a key given twice in one object (it keeps the last, other decoders the first) and a key
// that names a field in other letter case ("HOST" for host: it matches case-insensitively,
// where the schema and every other language see another property). Both are malformed.
// Objects under unknown keys are checked for duplicates only.
func checkKeys(data []byte, t reflect.Type) error {
	return checkValue(json.NewDecoder(bytes.NewReader(data)), t, 0)
}

func checkValue(dec *json.Decoder, t reflect.Type, depth int) error {
	if depth > maxDepth {
		return &SyntaxError{Offset: int(dec.InputOffset()), Msg: "nested too deep"}
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return &SyntaxError{Offset: int(dec.InputOffset()), Msg: err.Error()}
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return &SyntaxError{Offset: int(dec.InputOffset()), Msg: err.Error()}
			}
			key, _ := kt.(string)
			if seen[key] {
				return &SyntaxError{Offset: int(dec.InputOffset()), Msg: "key " + quoteBounded(key) + " given twice"}
			}
			seen[key] = true
			ft, known := fields[key]
			if !known && fields != nil {
				for name := range fields {
					if strings.EqualFold(name, key) {
						return &SyntaxError{Offset: int(dec.InputOffset()), Msg: "key " + quoteBounded(key) + " is not " + strconv.Quote(name) + ": keys are case-sensitive"}
					}
				}
			}
			if err := checkValue(dec, ft, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
	case json.Delim('['):
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		for dec.More() {
			if err := checkValue(dec, et, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
	}
	if err != nil {
		return &SyntaxError{Offset: int(dec.InputOffset()), Msg: err.Error()}
	}
	return nil
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields returns the JSON names of t's fields and their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := map[string]reflect.Type{}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() && !sf.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		et := sf.Type
		if et.Kind() == reflect.Pointer {
			et = et.Elem()
		}
		switch {
		case name == "-":
			continue
		case name == "" && sf.Anonymous && et.Kind() == reflect.Struct:
			for k, v := range jsonFields(et) { // promoted, as encoding/json reads them
				f[k] = v
			}
			continue
		case name == "":
			name = sf.Name
		}
		f[name] = sf.Type
	}
	fieldCache.Store(t, f)
	return f
}
