"""The dense path's mutants in the order every report lists them.

Each family of mutants lives in a module of its own (the package docstring
lists them); this module only puts them in one order. The order is the kill
matrix's and ``parity list mutants``'s, so a mutant added to a family is added
here too, where its report line belongs.
"""

from __future__ import annotations

from ports.mutants.base import Mutant
from ports.mutants.dcp_steps import DcpReorderInContextOrder, DcpReorderKeepsPadding, DcpSegmentUncapped
from ports.mutants.integer_widths import (
    DcpLocalStartsInt16,
    DcpTokenToSeqInt8,
    DeviceTokenToSeqUint8,
    RequestIndexInt16,
    TokenToSeqUint8,
    WorkspaceInt32,
)
from ports.mutants.merge_numerics import (
    MergeDropsBelowFp32Eps,
    MergeLseTokenStrideOne,
    MergeSkipsZeroWeightSide,
    MergeTokensWithContextFalsy,
)
from ports.mutants.merging import EqualShareNoNeutralise, FiniteLseOnEmptyRows, MergeInBf16, SwappedLse
from ports.mutants.metadata import ContinuationFromLastRequest, ContinuationOverWholeChunk, QueryStartNotRebased
from ports.mutants.planning import (
    DcpPaddingWithoutInterleave,
    LegacyGrid,
    SplitTakesWholeRemainder,
    UnalignedSplit,
    WorkspaceFloor,
    ZeroContextJoinsRun,
)
from ports.mutants.powers_of_two import (
    AlignmentMaxNotLcm,
    DcpPaddedByShift,
    DcpRankLensByMask,
    RoundDownByMask,
    WorkspaceRoundThenCap,
)
from ports.mutants.three_pieces import ContinuationMergesPreviousChunk

DENSE_MUTANTS: dict[str, type[Mutant]] = {
    m.name: m
    for m in (
        LegacyGrid,
        FiniteLseOnEmptyRows,
        EqualShareNoNeutralise,
        WorkspaceFloor,
        ContinuationOverWholeChunk,
        ContinuationFromLastRequest,
        UnalignedSplit,
        SplitTakesWholeRemainder,
        ZeroContextJoinsRun,
        DcpPaddingWithoutInterleave,
        SwappedLse,
        MergeInBf16,
        QueryStartNotRebased,
        # Each aimed at an input class the suites must produce (``aimed_at``).
        TokenToSeqUint8,
        DcpTokenToSeqInt8,
        DcpLocalStartsInt16,
        RequestIndexInt16,
        DeviceTokenToSeqUint8,
        WorkspaceInt32,
        AlignmentMaxNotLcm,
        RoundDownByMask,
        DcpPaddedByShift,
        DcpRankLensByMask,
        WorkspaceRoundThenCap,
        MergeSkipsZeroWeightSide,
        MergeDropsBelowFp32Eps,
        MergeLseTokenStrideOne,
        MergeTokensWithContextFalsy,
        ContinuationMergesPreviousChunk,
        # The DCP step of a chunk, killed at L3 only.
        DcpReorderInContextOrder,
        DcpReorderKeepsPadding,
        DcpSegmentUncapped,
    )
}
