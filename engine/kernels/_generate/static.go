package main

// Static kernels: the matrix kernels without Go declarations.
//
// Most of the functions main writes are matrix kernels of one of two
// signatures: sig (the tile kernels: prefill tiles, decode rows, panels) and
// sigX (the decode kernels that take activation data from auxPrep). avo
// would declare each of them in Go, four lines a kernel, and the Go side
// would name each one as a Go function. Instead, once Generate has written
// dot_amd64.s and dot_amd64.go, staticKernels rewrites both:
//
//   - the kernels of those two signatures lose their stubs in dot_amd64.go
//     (their doc comments move above their code in dot_amd64.s), and their
//     TEXT lines name file-local symbols: TEXT dotQ4_0R2C1<>(SB);
//   - per signature, dot_amd64.s gains a read-only table of the kernels'
//     addresses (tileKernels<>, rowsXKernels<>), a function that returns it
//     (tileKernelTable, rowsXKernelTable), and a trampoline (callTile,
//     callRowsX) that takes a kernel's arguments, then the kernel's address
//     pc, and jumps to pc;
//   - dot_amd64.go gains the declarations of those four functions and the
//     kernels' names in table order, one string per table (tileKernelNames,
//     rowsXKernelNames).
//
// The trampoline jumps (JMP, not CALL), so the kernel runs with the stack as
// a call of the kernel would have left it, pc one word past its last
// argument: it reads its arguments at the same offsets from FP, and its RET
// returns to the trampoline's caller. Its argument frame is therefore the
// trampoline's: the kernel's TEXT line says that frame's size and its
// FUNCDATA points the runtime at the trampoline's pointer map (the compiler
// writes one for every Go declaration, here callTile.args_stackmap), which
// the assembler would otherwise take from the kernel's own Go declaration.
//
// The Go side (kernel_amd64.go) looks kernels up by name in the name lists
// and calls them through the trampolines.

import (
	"flag"
	"fmt"
	"go/format"
	"os"
	"regexp"
	"strings"
)

// kernelTable is the kernels of one signature.
type kernelTable struct {
	kind  string // tile or rowsX: callTile, tileKernelTable, tileKernels<>, tileKernelNames
	sig   string
	what  string // what the kernels are, for the comments
	names []string
}

func (t *kernelTable) call() string       { return "call" + strings.ToUpper(t.kind[:1]) + t.kind[1:] }
func (t *kernelTable) params() string     { return strings.TrimPrefix(t.sig, "func") }
func (t *kernelTable) words() int         { return strings.Count(t.sig, ",") + 1 }
func (t *kernelTable) tableFunc() string  { return t.kind + "KernelTable" }
func (t *kernelTable) tableData() string  { return t.kind + "Kernels<>" }
func (t *kernelTable) namesConst() string { return t.kind + "KernelNames" }

// callParams is the trampoline's parameter list: the kernel's, then pc.
func (t *kernelTable) callParams() string {
	p := t.params()
	return p[:len(p)-1] + ", pc uintptr)"
}

// staticKernels rewrites the files Generate wrote (the -out and -stubs
// flags) as the comment above says.
func staticKernels() {
	tables := []*kernelTable{
		{kind: "tile", sig: sig, what: "tile kernels (dotFn)"},
		{kind: "rowsX", sig: sigX, what: "decode kernels with auxPrep data (rowsXFn)"},
	}
	asmPath, stubsPath := flag.Lookup("out").Value.String(), flag.Lookup("stubs").Value.String()
	asm, err := os.ReadFile(asmPath)
	check(err)
	stubs, err := os.ReadFile(stubsPath)
	check(err)

	// The stubs file: a header, then one block per function (doc comment,
	// pragmas, declaration), blank lines between.
	blocks := strings.Split(string(stubs), "\n\n")
	kept := blocks[:0]
	s := string(asm)
	for _, b := range blocks {
		t, name := stubTable(tables, b)
		if t == nil {
			kept = append(kept, b)
			continue
		}
		t.names = append(t.names, name)
		var doc strings.Builder
		for _, l := range strings.Split(b, "\n") {
			if strings.HasPrefix(l, "// ") {
				doc.WriteString(l + "\n")
			}
		}
		s = staticText(s, t, name, doc.String())
	}
	for _, t := range tables {
		if len(t.names) == 0 {
			fail("no kernels of signature %s", t.sig)
		}
	}

	var a, g strings.Builder
	a.WriteString(s)
	g.WriteString(strings.Join(kept, "\n\n"))
	for _, t := range tables {
		writeTableAsm(&a, t)
		writeTableGo(&g, t)
	}
	src, err := format.Source([]byte(g.String()))
	check(err)
	out := strings.Replace(a.String(), "#include \"textflag.h\"\n", "#include \"textflag.h\"\n#include \"funcdata.h\"\n", 1)
	check(os.WriteFile(asmPath, []byte(out), 0o644))
	check(os.WriteFile(stubsPath, src, 0o644))
}

// stubTable returns the table whose signature the stub block b declares,
// and the function's name; nil for any other block.
func stubTable(tables []*kernelTable, b string) (*kernelTable, string) {
	lines := strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	decl, ok := strings.CutPrefix(lines[len(lines)-1], "func ")
	if !ok {
		return nil, ""
	}
	for _, t := range tables {
		if name, ok := strings.CutSuffix(decl, t.params()); ok && !strings.ContainsAny(name, " (") {
			return t, name
		}
	}
	return nil, ""
}

// textLine is a TEXT line as avo writes it: name, flags, frame and
// argument sizes.
var textLine = regexp.MustCompile(`^TEXT ·(\w+)\(SB\), (\w+), \$(\d+)-(\d+)$`)

// staticText makes the kernel name in the assembly s a file-local symbol
// with the argument frame of t's trampoline, its doc comment above it.
func staticText(s string, t *kernelTable, name, doc string) string {
	key := "\nTEXT ·" + name + "(SB), "
	if n := strings.Count(s, key); n != 1 {
		fail("%d TEXT lines for %s", n, name)
	}
	i := strings.Index(s, key) + 1
	j := i + strings.IndexByte(s[i:], '\n')
	m := textLine.FindStringSubmatch(s[i:j])
	if m == nil || m[4] != fmt.Sprint(8*t.words()) {
		fail("%s: unexpected TEXT line %q for %s", name, s[i:j], t.sig)
	}
	text := fmt.Sprintf("TEXT %s<>(SB), %s, $%s-%d\n\tFUNCDATA $FUNCDATA_ArgsPointerMaps, ·%s·args_stackmap(SB)",
		name, m[2], m[3], 8*(t.words()+1), t.call())
	s = s[:i] + text + s[j:]
	// the doc comment above avo's "// func name(...)" line
	k := strings.LastIndex(s[:i], "\n// func "+name+"(")
	if k < 0 {
		fail("no // func line above %s", name)
	}
	return s[:k+1] + doc + s[k+1:]
}

// writeTableAsm appends t's address table, the function returning it and
// its trampoline to the assembly.
func writeTableAsm(a *strings.Builder, t *kernelTable) {
	n := len(t.names)
	fmt.Fprintf(a, "\n// %s: the addresses of the %s, in the order of %s.\n", t.tableData(), t.what, t.namesConst())
	for i, name := range t.names {
		fmt.Fprintf(a, "DATA %s+%d(SB)/8, $%s<>(SB)\n", t.tableData(), 8*i, name)
	}
	fmt.Fprintf(a, "GLOBL %s(SB), RODATA|NOPTR, $%d\n", t.tableData(), 8*n)
	fmt.Fprintf(a, "\n// func %s() *[%d]uintptr\n", t.tableFunc(), n)
	fmt.Fprintf(a, "TEXT ·%s(SB), NOSPLIT, $0-8\n", t.tableFunc())
	fmt.Fprintf(a, "\tLEAQ %s(SB), AX\n\tMOVQ AX, ret+0(FP)\n\tRET\n", t.tableData())
	fmt.Fprintf(a, "\n// func %s%s\n", t.call(), t.callParams())
	fmt.Fprintf(a, "TEXT ·%s(SB), NOSPLIT, $0-%d\n", t.call(), 8*(t.words()+1))
	fmt.Fprintf(a, "\tMOVQ pc+%d(FP), AX\n\tJMP  AX\n", 8*t.words())
}

// writeTableGo appends the declarations of t's table function and
// trampoline and the names of its kernels to the stubs.
func writeTableGo(g *strings.Builder, t *kernelTable) {
	n := len(t.names)
	fmt.Fprintf(g, "\n// %s returns the addresses of the %d %s, in the order of %s.\n", t.tableFunc(), n, t.what, t.namesConst())
	fmt.Fprintf(g, "func %s() *[%d]uintptr\n", t.tableFunc(), n)
	fmt.Fprintf(g, "\n// %s calls the kernel at pc, an entry of %s, with the other arguments.\n", t.call(), t.tableFunc())
	fmt.Fprintf(g, "// It jumps there: see static.go in _generate.\n//\n//go:noescape\n")
	fmt.Fprintf(g, "func %s%s\n", t.call(), t.callParams())
	fmt.Fprintf(g, "\n// %s are the names of the %s in dot_amd64.s, in the order of %s.\n", t.namesConst(), t.what, t.tableFunc())
	fmt.Fprintf(g, "const %s = %q\n", t.namesConst(), strings.Join(t.names, " "))
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "_generate: "+format+"\n", args...)
	os.Exit(1)
}
