package main

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// upDataDir is where `shoal up` keeps its cluster by default (relative to
// the directory it runs in, the repository root for `make run`).
const upDataDir = ".shoal/up"

// upFile is what a running `shoal up` writes for the CLI beside it, so
// `shoal status` in the same directory finds the cluster without
// SHOAL_ADDR or SHOAL_TOKEN; it is removed when the cluster stops.
type upFile struct {
	Addr         string `json:"addr"`          // the first agent's API, http://127.0.0.1:PORT
	AdminKey     string `json:"admin_key"`     // the cluster secret
	InferenceKey string `json:"inference_key"` // the OpenAI endpoint's key
	Model        string `json:"model"`         // the model this run serves
}

func upFilePath(dataDir string) string { return filepath.Join(dataDir, "cluster.json") }

func writeUpFile(dataDir string, f upFile) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(upFilePath(dataDir), append(b, '\n'), 0o600)
}

// localUp reads the file of a `shoal up` running from this directory.
func localUp() (upFile, bool) {
	var f upFile
	b, err := os.ReadFile(upFilePath(upDataDir))
	if err != nil || json.Unmarshal(b, &f) != nil || f.Addr == "" {
		return upFile{}, false
	}
	return f, true
}

// upModel is the model `shoal chat` talks to by default when it talks to
// the `shoal up` running from this directory (no address given): the one
// that run serves, not the first the cluster lists, which may be one an
// earlier run loaded.
func upModel(addrFlag string) string {
	if addrFlag == "" && os.Getenv("SHOAL_ADDR") == "" {
		if up, ok := localUp(); ok {
			return up.Model
		}
	}
	return ""
}

// cliToken is the API key the CLI sends: --token, else $SHOAL_TOKEN, else,
// when no address was given either, the key of a `shoal up` running from
// this directory.
func cliToken(flag, addrFlag string) string {
	if flag != "" {
		return flag
	}
	if t := os.Getenv("SHOAL_TOKEN"); t != "" {
		return t
	}
	if addrFlag == "" && os.Getenv("SHOAL_ADDR") == "" {
		if up, ok := localUp(); ok {
			return up.AdminKey
		}
	}
	return ""
}
