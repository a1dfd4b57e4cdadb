// Package zapio routes the text logs of libraries that write to an
// io.Writer or *log.Logger (raft's hclog, memberlist) into zap, keeping
// the level each line names ([DEBUG], [INFO], [WARN], [ERR]). It must not
// import other shoal packages.
package zapio
