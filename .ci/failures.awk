# Prints, for each failed Go test in a `go test -v` log, the last lines its
# test files wrote before the `--- FAIL` line (the failure's message is
# among them; the agent log tails a failed integration test dumps come
# after it and would otherwise push it out of a short tail of the log).
# Also prints panics and build failures.
/^=== RUN   [^ \/]+$/ { n = 0 }
/^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / && !/log \(tail\) ----/ { buf[n % 12] = $0; n++ }
/^[ \t]*--- FAIL: / {
	print
	for (i = (n > 12 ? n - 12 : 0); i < n; i++) print buf[i % 12]
	n = 0
}
/^panic: |^FAIL\t.*\[build failed\]|^[^ \t]+\.go:[0-9]+:[0-9]+: / { print }
