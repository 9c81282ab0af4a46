package events

import "time"

// FeedbackRollup is one window × env × scene × model × name × source of feedback, by the
// time the verdicts were given (their ts, not their request's): what the aggregator writes
// to feedback_rollups and publishes on rollup.feedback.<env>.<scene>. Env, scene and model
// are what the feedback events carried, empty where they did not. Like the other rollups
// it is the window's row or a correction adding verdicts that arrived after the window was
// written; counts and sums add with plain sum().
type FeedbackRollup struct {
	V             int       `json:"v"`
	WindowStart   time.Time `json:"window_start"`
	WindowSeconds int       `json:"window_seconds"`
	Kind          string    `json:"kind"`

	Env    string `json:"env"`
	Scene  string `json:"scene"`
	Model  string `json:"model"`
	Name   string `json:"name"`   // thumbs, rating, quality, task_completed or the sender's own
	Source string `json:"source"` // user, evaluator or heuristic

	Count    uint64  `json:"count"`
	Positive uint64  `json:"positive"` // verdicts with value > 0: share positive = Positive / Count
	Late     uint64  `json:"late"`
	Sum      float64 `json:"sum"`
	// The values' t-digest: a few figures and the centroids, mergeable over windows.
	ValueMin     float64   `json:"value_min"`
	ValueMax     float64   `json:"value_max"`
	ValueP50     float64   `json:"value_p50"`
	ValueP90     float64   `json:"value_p90"`
	ValueMeans   []float64 `json:"value_means"`
	ValueWeights []uint64  `json:"value_weights"`
}

// SubjectFeedbackRollupAll matches every feedback rollup's subject.
const SubjectFeedbackRollupAll = "rollup.feedback.>"

// FeedbackRollupSubject returns rollup.feedback.<env>.<scene>; an empty label is "_".
func FeedbackRollupSubject(env, scene string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.feedback.", env, scene, true))
}
