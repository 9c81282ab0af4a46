package events

import "time"

// SubjectWatermarkAll matches every aggregator's watermark on the ROLLUPS stream.
const SubjectWatermarkAll = "rollup.watermark.>"

// Watermark is an aggregator's progress, published on rollup.watermark.<consumer> (stream
// ROLLUPS): every window that ends at or before Through is closed and written, and its
// rollups are on the stream ahead of this message. An alerter that has read it has every
// rollup of those windows this aggregator will publish (later events make correction rows).
type Watermark struct {
	V int `json:"v"`
	// Consumer is the aggregator's AGG_CONSUMER: one aggregator per name.
	Consumer      string    `json:"consumer"`
	Through       time.Time `json:"through"`
	WindowSeconds int       `json:"window_seconds"`
	At            time.Time `json:"at"` // when it was published
}

// WatermarkSubject returns rollup.watermark.<consumer>.
func WatermarkSubject(consumer string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.watermark.", consumer, "", false))
}
