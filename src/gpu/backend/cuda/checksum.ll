; The page checksum kernel (src/core/object/checksum.rs defines the checksum; this computes
; its order-free part, the wrapping sum of the word terms, on the device).
;
; kvc_page_term_sums(addrs, lens, sums, split): block b covers slice b % split of page
; b / split. Page p starts at device address addrs[p] (8-byte aligned) and is lens[p] bytes
; long. Each of the 256 threads of a block sums the terms of every 256th word of its slice;
; thread 0 adds the zero-padded partial last word (slice 0 only) and then the block's
; partial sums, and stores the total at sums[b]. The host adds a page's `split` totals and
; applies `finish`. Regenerate the PTX with `scripts/gen-ptx` after editing.

target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

@partials = internal addrspace(3) global [256 x i64] undef, align 8

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare void @llvm.nvvm.barrier0()

; term(w, i): x = w ^ (i * WORD_KEY + WORD_SALT); x = (x ^ (x >> 31)) * MIX; x ^ (x >> 29)
define internal i64 @term(i64 %word, i64 %index) alwaysinline {
  %key = mul i64 %index, -7046029254386353131      ; WORD_KEY 0x9E3779B97F4A7C15
  %salted = add i64 %key, -2960836687051489901      ; WORD_SALT 0xD6E8FEB86659FD93
  %keyed = xor i64 %word, %salted
  %shifted = lshr i64 %keyed, 31
  %folded = xor i64 %keyed, %shifted
  %mixed = mul i64 %folded, -4658895280553007687    ; MIX 0xBF58476D1CE4E5B9
  %shifted2 = lshr i64 %mixed, 29
  %term = xor i64 %mixed, %shifted2
  ret i64 %term
}

define void @kvc_page_term_sums(i64 addrspace(1)* %addrs, i64 addrspace(1)* %lens, i64 addrspace(1)* %sums, i32 %split) {
entry:
  %tid32 = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %block32 = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %page32 = udiv i32 %block32, %split
  %slice32 = urem i32 %block32, %split
  %tid = zext i32 %tid32 to i64
  %page = zext i32 %page32 to i64
  %slice = zext i32 %slice32 to i64
  %split64 = zext i32 %split to i64
  %block = zext i32 %block32 to i64
  %addr_at = getelementptr i64, i64 addrspace(1)* %addrs, i64 %page
  %addr = load i64, i64 addrspace(1)* %addr_at, align 8
  %len_at = getelementptr i64, i64 addrspace(1)* %lens, i64 %page
  %len = load i64, i64 addrspace(1)* %len_at, align 8
  %words = lshr i64 %len, 3
  ; slice bounds: chunk = ceil(words / split); [slice * chunk, min(words, (slice + 1) * chunk))
  %words_up = add i64 %words, %split64
  %words_up1 = sub i64 %words_up, 1
  %chunk = udiv i64 %words_up1, %split64
  %start = mul i64 %slice, %chunk
  %end_raw = add i64 %start, %chunk
  %end_small = icmp ult i64 %end_raw, %words
  %end = select i1 %end_small, i64 %end_raw, i64 %words
  %base = inttoptr i64 %addr to i64 addrspace(1)*
  %first = add i64 %start, %tid
  br label %loop_check

loop_check:
  %i = phi i64 [ %first, %entry ], [ %i_next, %loop_body ]
  %acc = phi i64 [ 0, %entry ], [ %acc_next, %loop_body ]
  %more = icmp ult i64 %i, %end
  br i1 %more, label %loop_body, label %after_loop

loop_body:
  %word_at = getelementptr i64, i64 addrspace(1)* %base, i64 %i
  %word = load i64, i64 addrspace(1)* %word_at, align 8
  %t = call i64 @term(i64 %word, i64 %i)
  %acc_next = add i64 %acc, %t
  %i_next = add i64 %i, 256
  br label %loop_check

after_loop:
  %rem = and i64 %len, 7
  %is_thread0 = icmp eq i64 %tid, 0
  %is_slice0 = icmp eq i64 %slice, 0
  %has_tail = icmp ne i64 %rem, 0
  %first_thread = and i1 %is_thread0, %is_slice0
  %do_tail = and i1 %first_thread, %has_tail
  br i1 %do_tail, label %tail_start, label %reduce

tail_start:
  %bytes = inttoptr i64 %addr to i8 addrspace(1)*
  %tail_offset = shl i64 %words, 3
  br label %tail_check

tail_check:
  %j = phi i64 [ 0, %tail_start ], [ %j_next, %tail_body ]
  %tail_word = phi i64 [ 0, %tail_start ], [ %tail_word_next, %tail_body ]
  %tail_more = icmp ult i64 %j, %rem
  br i1 %tail_more, label %tail_body, label %tail_done

tail_body:
  %byte_offset = add i64 %tail_offset, %j
  %byte_at = getelementptr i8, i8 addrspace(1)* %bytes, i64 %byte_offset
  %byte = load i8, i8 addrspace(1)* %byte_at, align 1
  %byte64 = zext i8 %byte to i64
  %bit_shift = shl i64 %j, 3
  %placed = shl i64 %byte64, %bit_shift
  %tail_word_next = or i64 %tail_word, %placed
  %j_next = add i64 %j, 1
  br label %tail_check

tail_done:
  %tail_term = call i64 @term(i64 %tail_word, i64 %words)
  %acc_tail = add i64 %acc, %tail_term
  br label %reduce

reduce:
  %acc_final = phi i64 [ %acc, %after_loop ], [ %acc_tail, %tail_done ]
  %partial_at = getelementptr [256 x i64], [256 x i64] addrspace(3)* @partials, i64 0, i64 %tid
  store i64 %acc_final, i64 addrspace(3)* %partial_at, align 8
  call void @llvm.nvvm.barrier0()
  br i1 %is_thread0, label %sum_check, label %exit

sum_check:
  %k = phi i64 [ 0, %reduce ], [ %k_next, %sum_body ]
  %total = phi i64 [ 0, %reduce ], [ %total_next, %sum_body ]
  %sum_more = icmp ult i64 %k, 256
  br i1 %sum_more, label %sum_body, label %store

sum_body:
  %other_at = getelementptr [256 x i64], [256 x i64] addrspace(3)* @partials, i64 0, i64 %k
  %other = load i64, i64 addrspace(3)* %other_at, align 8
  %total_next = add i64 %total, %other
  %k_next = add i64 %k, 1
  br label %sum_check

store:
  %sum_at = getelementptr i64, i64 addrspace(1)* %sums, i64 %block
  store i64 %total, i64 addrspace(1)* %sum_at, align 8
  br label %exit

exit:
  ret void
}

!nvvm.annotations = !{!0, !1}
!0 = !{void (i64 addrspace(1)*, i64 addrspace(1)*, i64 addrspace(1)*, i32)* @kvc_page_term_sums, !"kernel", i32 1}
!1 = !{void (i64 addrspace(1)*, i64 addrspace(1)*, i64 addrspace(1)*, i32)* @kvc_page_term_sums, !"maxntidx", i32 256}
