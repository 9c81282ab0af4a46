package events

import "unicode/utf8"

// Stream names, and the subjects each one holds.
const (
	StreamEvents  = "LLM_EVENTS"     // llm.req.<env>.<scene>
	StreamGPU     = "GPU_SAMPLES"    // gpu.sample.<host>
	StreamEngine  = "ENGINE_SAMPLES" // engine.sample.<host>
	StreamRollups = "ROLLUPS"        // rollup.tokens.<env>.<scene>, rollup.gpu.<host>, rollup.engine.<host>, rollup.host.<host>, rollup.feedback.<env>.<scene>
	StreamAlerts  = "ALERTS"         // alerts.<severity>.<rule>
	// StreamFeedback holds feedback events, apart from LLM_EVENTS so that the request
	// consumers (which read all of it) never see them, and with a longer age: verdicts
	// arrive hours after their requests, and a replay must find both.
	StreamFeedback = "FEEDBACK" // llm.feedback.<env>.<scene>

	// StreamHost holds host samples, in a stream of their own for the reason engine
	// samples have one: a consumer of GPU_SAMPLES (the aggregator's GPU windows, a
	// recording made for replay) only ever receives GPU samples, and each stream's
	// retention is set alone.
	StreamHost = "HOST_SAMPLES" // host.sample.<host>

	SubjectRequestsAll      = "llm.req.>"
	SubjectGPUSamplesAll    = "gpu.sample.>"
	SubjectEngineSamplesAll = "engine.sample.>"
	SubjectHostSamplesAll   = "host.sample.>"
	SubjectTokenRollupAll   = "rollup.tokens.>"
	SubjectGPURollupAll     = "rollup.gpu.>"
	SubjectEngineRollupAll  = "rollup.engine.>"
	SubjectHostRollupAll    = "rollup.host.>"
	SubjectRollupsAll       = "rollup.>"
	SubjectAlertsAll        = "alerts.>"
	SubjectFeedbackAll      = "llm.feedback.>"

	// SubjectInvalid carries dead letters: messages no consumer could use, with the reason.
	SubjectInvalid = "llm.invalid"
)

// MaxTokenLen bounds a sanitised subject token; the exact label travels in the payload.
const MaxTokenLen = 64

// AppendToken appends label as one subject token: every byte other than ASCII letters,
// digits, '-' and '_' (so '.', '*', '>', whitespace, control characters and non-ASCII runes)
// becomes '_', an empty label becomes "_", and the token is cut at MaxTokenLen bytes. The
// label can therefore never change the subject's shape. It does not allocate when dst has room.
func AppendToken(dst []byte, label string) []byte {
	if label == "" {
		return append(dst, '_')
	}
	n := 0
	for i := 0; i < len(label) && n < MaxTokenLen; n++ {
		c := label[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			dst = append(dst, c)
			i++
		case c < utf8.RuneSelf:
			dst = append(dst, '_')
			i++
		default:
			_, size := utf8.DecodeRuneInString(label[i:])
			dst = append(dst, '_')
			i += size
		}
	}
	return dst
}

// Token returns label sanitised as one subject token; see AppendToken.
func Token(label string) string { return string(AppendToken(make([]byte, 0, len(label)), label)) }

func appendSubject(dst []byte, prefix string, a, b string, two bool) []byte {
	dst = append(dst, prefix...)
	dst = AppendToken(dst, a)
	if two {
		dst = append(dst, '.')
		dst = AppendToken(dst, b)
	}
	return dst
}

// AppendRequestSubject appends llm.req.<env>.<scene>.
func AppendRequestSubject(dst []byte, env, scene string) []byte {
	return appendSubject(dst, "llm.req.", env, scene, true)
}

// RequestSubject returns llm.req.<env>.<scene>.
func RequestSubject(env, scene string) string {
	return string(AppendRequestSubject(make([]byte, 0, 48), env, scene))
}

// GPUSampleSubject returns gpu.sample.<host>.
func GPUSampleSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "gpu.sample.", host, "", false))
}

// TokenRollupSubject returns rollup.tokens.<env>.<scene>.
func TokenRollupSubject(env, scene string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.tokens.", env, scene, true))
}

// GPURollupSubject returns rollup.gpu.<host>.
func GPURollupSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.gpu.", host, "", false))
}

// EngineRollupSubject returns rollup.engine.<host>.
func EngineRollupSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.engine.", host, "", false))
}

// AlertSubject returns alerts.<severity>.<rule>.
func AlertSubject(severity, rule string) string {
	return string(appendSubject(make([]byte, 0, 48), "alerts.", severity, rule, true))
}

// AppendFeedbackSubject appends llm.feedback.<env>.<scene>; a feedback event that does not
// know its env or scene has "_" in its place.
func AppendFeedbackSubject(dst []byte, env, scene string) []byte {
	return appendSubject(dst, "llm.feedback.", env, scene, true)
}

// FeedbackSubject returns llm.feedback.<env>.<scene>.
func FeedbackSubject(env, scene string) string {
	return string(AppendFeedbackSubject(make([]byte, 0, 48), env, scene))
}
