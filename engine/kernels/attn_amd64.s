//go:build amd64 && !noasm && gc

#include "textflag.h"

// func axpyF16AVX2(y *float32, alpha float32, x *uint16, n int)
// y[i] += alpha * float32(x[i]) for n elements, n a multiple of 8
// (F16C conversion, one FMA per 8 elements).
TEXT ·axpyF16AVX2(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	VBROADCASTSS alpha+8(FP), Y0
	MOVQ         x+16(FP), SI
	MOVQ         n+24(FP), CX
	SHRQ         $3, CX
	JZ           done

loop:
	VCVTPH2PS   (SI), Y1
	VFMADD213PS (DI), Y0, Y1
	VMOVUPS     Y1, (DI)
	ADDQ        $16, SI
	ADDQ        $32, DI
	DECQ        CX
	JNZ         loop

done:
	VZEROUPPER
	RET
