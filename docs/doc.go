// Package docs is shoal's user guide: one Markdown page per topic (the
// CLI, models and the hub, distributed execution, disaggregation, the
// OpenAI API, operations, architecture, testing), into which the
// repository's README.md links. It holds no product code and nothing
// imports it; it must not restate at length what a command's --help or
// SECURITY.md says, but show how the pieces fit and link to them.
//
// Its test runs the guide. Every ```sh block of docs/*.md and README.md
// runs, in order, through sh -e, with a shoal built once by TestMain
// (CGO_ENABLED=0) first on PATH and as bin/shoal, in a working directory
// and HOME of the page's own. An HTML comment on the line right above a
// block changes that:
//
//	<!-- not run: REASON -->             skipped; the test log shows REASON
//	<!-- needs: curl jq -->              skipped where a program is missing
//	<!-- background, ready: COMMAND -->  one command left running (shoal up,
//	                                     shoal agent): later blocks wait until
//	                                     COMMAND exits 0; Ctrl-C stops it after
//	                                     the page, and it must exit 0
//	<!-- exit status: N REASON -->       a background block's status is N
//
// A page's blocks share its directory and the variables they export, as
// in one terminal. Each page gets free ports: shoal up in a background
// block gets --port P, and ports 8080 to 8109 written after a colon or a
// --*-port flag become P to P+29. Hub references resolve against a fake
// hub (hub/hubtest) that serves a small random model under the names the
// pages use, and curl fails on an HTTP error (a ~/.curlrc). A block has 90
// seconds; -short skips the blocks that start clusters. Blocks in other
// languages (text, json, python) never run; a fence without a language,
// or a comment above a block that is no directive, fails the test.
//
// The test also checks the CLI page against every command's --help (a
// section per command, every flag named, the defaults of its tables) and
// the architecture page against the tree (every folder and package named,
// its dependency table equal to layout_test.go's mayImport).
package docs
