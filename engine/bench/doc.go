// Package bench measures the engine the way llama-bench does: prompt
// processing (pp) and token generation (tg) rates, plus the machine's memory
// bandwidth measured in the same run, so decode can be reported as a fraction
// of its bandwidth roofline.
package bench
