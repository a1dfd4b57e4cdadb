// Command shoal is the single binary of a shoal cluster: the agent and the
// operator's CLI. Each command lives in its own file and is wired in
// commands(); the commands are thin and call into the packages that own the
// work.
package main
