// Package report is what the integration suite's attacker program prints
// and the attack tests read: one JSON object per run, the calls it made
// and how the cluster answered them.
package report
