package events

import (
	"errors"
	"reflect"
	"strings"
	"time"
)

// sample is a GPU, engine or host sample: a struct whose optional readings are pointers.
type sample interface {
	*GPUSample | *EngineSample | *HostSample
	ValidateAt(now time.Time) error
}

// DropBadReadings validates s at now, leaving out each reading that breaks the contract (a
// driver's glitch: utilisation over 100 %, memory used above the total, a histogram that
// does not add up), for a producer that must not lose a whole sample over one reading: the
// readings are the sample's pointer fields, a histogram's sub-fields take the histogram
// with them. It returns the errors of the readings left out, and the error that remains
// when what identifies the sample (version, time, host, index, names) breaks it.
func DropBadReadings[S sample](s S, now time.Time) (dropped []error, err error) {
	err = s.ValidateAt(now)
	for err != nil {
		fe, ok := errors.AsType[*FieldError](err)
		if !ok || !dropReading(reflect.ValueOf(s).Elem(), fe.Field) {
			return dropped, err
		}
		dropped = append(dropped, err)
		err = s.ValidateAt(now)
	}
	return dropped, nil
}

// dropReading sets the pointer field of v whose JSON name starts field to nil, and reports
// whether there was one set.
func dropReading(v reflect.Value, field string) bool {
	field, _, _ = strings.Cut(field, ".")
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if f := v.Field(i); name == field && f.Kind() == reflect.Pointer && !f.IsNil() {
			f.SetZero()
			return true
		}
	}
	return false
}
