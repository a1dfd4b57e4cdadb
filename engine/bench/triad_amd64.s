//go:build !noasm

#include "textflag.h"

// func triadAVX2(a, b, c *float64, n int, s float64)
// a[i] = b[i] + s*c[i] for n elements, n a multiple of 16.
TEXT ·triadAVX2(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), SI
	MOVQ c+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSD s+32(FP), Y0
	SHRQ $4, CX
	JZ   done

loop:
	VMOVUPD (DX), Y1
	VMOVUPD 32(DX), Y2
	VMOVUPD 64(DX), Y3
	VMOVUPD 96(DX), Y4
	VFMADD213PD (SI), Y0, Y1
	VFMADD213PD 32(SI), Y0, Y2
	VFMADD213PD 64(SI), Y0, Y3
	VFMADD213PD 96(SI), Y0, Y4
	VMOVUPD Y1, (DI)
	VMOVUPD Y2, 32(DI)
	VMOVUPD Y3, 64(DI)
	VMOVUPD Y4, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	DECQ CX
	JNZ  loop

done:
	VZEROUPPER
	RET
