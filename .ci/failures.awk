# Prints, for each failed Go test in a `go test` log, the lines its test
# files wrote: before the `--- FAIL` line (go test -v streams them) and
# after it (without -v, go test prints them below it). The agent log tails
# a failed integration test dumps are left out: they come among these
# lines and would otherwise push the failure's message out of a short
# tail of the log. Also prints panics and build failures.
function msg(line) { return line ~ /^[ \t]+[A-Za-z0-9_]+\.go:[0-9]+: / && line !~ /log \(tail\) ----/ }
# A line that is not indented ends what one test wrote.
/^[^ \t]/ && !/^[ \t]*--- FAIL: / { n = 0; after = 0 }
after > 0 && msg($0) { print; after--; next }
msg($0) { buf[n % 12] = $0; n++ }
/^[ \t]*--- FAIL: / {
	print
	for (i = (n > 12 ? n - 12 : 0); i < n; i++) print buf[i % 12]
	n = 0
	after = 30
}
/^panic: |^FAIL\t.*\[build failed\]|^[^ \t]+\.go:[0-9]+:[0-9]+: / { print }
