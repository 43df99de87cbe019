"""A small reader for CUDA cubins (64-bit little-endian ELF), enough to know a kernel's resources.

Why not the ptxas log alone: a cubin served from the cache or compiled elsewhere has no log, and
the binary is what the GPU runs.  What is read, and where ptxas (CUDA 13.0) puts it:

- ``.symtab``: kernels are ``STT_FUNC`` symbols that have a ``.nv.info.<name>`` section.
- ``.nv.info`` (module-wide) holds per-function attributes keyed by symbol index:
  ``EIATTR_REGCOUNT`` (registers per thread), ``EIATTR_FRAME_SIZE`` (the function's own stack
  frame, ptxas's "bytes stack frame"), ``EIATTR_MIN_STACK_SIZE`` (the stack a launch needs,
  callees included, ptxas's "cumulative stack size") and ``EIATTR_MAX_STACK_SIZE``.
- ``.nv.info.<kernel>`` holds kernel attributes: ``EIATTR_MAX_THREADS`` (``__launch_bounds__``)
  and ``EIATTR_REQNTID`` (a required block size).
- ``.nv.shared.<kernel>`` (``SHT_NOBITS``) is the kernel's static shared memory.  On sm_80 and
  newer ptxas also emits ``.nv.shared.reserved.0`` and then lays the 1 KiB the hardware reserves
  per block at the front of every kernel's shared section; that kilobyte is subtracted here, so
  the number equals ptxas's "bytes smem" and the ``__shared__`` arrays the source declares.

Every ``.nv.info`` entry is a 4-byte header (format, attribute, 16-bit word); for
``EIFMT_SVAL`` the word is the payload length and the payload follows, padded to 4 bytes.
The attribute numbers are NVIDIA's (``EIATTR_*``), as cuobjdump names them.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_SYMTAB = 2
SHT_NOBITS = 8
STT_OBJECT = 1
STT_FUNC = 2

EIFMT_SVAL = 4
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2F

# The per-block shared memory the hardware keeps for itself on sm_80+ (the driver's
# CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK); ptxas folds it into .nv.shared.<k>.
RESERVED_SHARED_BYTES = 1024
_RESERVED_SECTION = ".nv.shared.reserved.0"
# ptxas writes its own command line here; it differs between spellings of the same options
# (and with -v) while every other byte of the cubin is the same.
TOOLKIT_NOTE = ".note.nv.tkinfo"


class CubinError(ValueError):
    """The bytes are not a cubin this reader understands."""


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    size: int
    link: int
    info: int
    data: bytes  # empty for SHT_NOBITS


@dataclass(frozen=True)
class Symbol:
    index: int
    name: str
    info: int
    other: int
    shndx: int
    value: int
    size: int

    @property
    def is_function(self) -> bool:
        return self.info & 0xF == STT_FUNC

    @property
    def is_object(self) -> bool:
        return self.info & 0xF == STT_OBJECT


@dataclass(frozen=True)
class NvInfoAttribute:
    format: int
    attribute: int
    payload: bytes  # SVAL: the payload; other formats: the 16-bit word

    def words(self) -> tuple[int, ...]:
        usable = len(self.payload) - len(self.payload) % 4
        return struct.unpack_from(f"<{usable // 4}I", self.payload)


@dataclass(frozen=True)
class KernelAttributes:
    """What the cubin says about one kernel; ``None`` where the cubin says nothing."""

    name: str
    registers: int | None = None
    frame_bytes: int | None = None
    min_stack_bytes: int | None = None
    max_stack_bytes: int | None = None
    shared_bytes: int = 0
    max_threads: tuple[int, int, int] | None = None  # __launch_bounds__ (maxntid)
    required_threads: tuple[int, int, int] | None = None  # reqntid


@dataclass
class Cubin:
    """A parsed cubin: its ELF flags, sections and symbols."""

    elf_flags: int
    sections: list[Section]
    symbols: list[Symbol] = field(default_factory=list)

    @classmethod
    def parse(cls, image: bytes) -> Cubin:
        if len(image) < 64 or image[:4] != ELF_MAGIC:
            raise CubinError("not an ELF file")
        if image[4] != 2 or image[5] != 1:
            raise CubinError("not a 64-bit little-endian ELF file")
        try:
            return cls._parse(image)
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise CubinError(f"truncated or malformed cubin: {exc}") from exc

    @classmethod
    def _parse(cls, image: bytes) -> Cubin:
        (machine,) = struct.unpack_from("<H", image, 18)
        if machine != EM_CUDA:
            raise CubinError(f"ELF machine {machine} is not CUDA ({EM_CUDA})")
        (shoff,) = struct.unpack_from("<Q", image, 0x28)
        (flags,) = struct.unpack_from("<I", image, 0x30)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
        if shoff + shnum * shentsize > len(image) or shstrndx >= shnum or shentsize < 64:
            raise CubinError("section table lies outside the file")
        raw = [
            struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)
        ]

        def data_of(entry: tuple[int, ...]) -> bytes:
            offset, size = entry[4], entry[5]
            if entry[1] == SHT_NOBITS:
                return b""
            if offset + size > len(image):
                raise CubinError("a section lies outside the file")
            return image[offset : offset + size]

        names = data_of(raw[shstrndx])
        sections = [
            Section(i, _cstr(names, e[0]), e[1], e[2], e[5], e[6], e[7], data_of(e))
            for i, e in enumerate(raw)
        ]
        cubin = cls(flags, sections)
        for section in sections:
            if section.type == SHT_SYMTAB:
                strings = sections[section.link].data
                for j in range(section.size // 24):
                    st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                        "<IBBHQQ", section.data, j * 24
                    )
                    cubin.symbols.append(
                        Symbol(
                            j,
                            _cstr(strings, st_name),
                            st_info,
                            st_other,
                            st_shndx,
                            st_value,
                            st_size,
                        )
                    )
        return cubin

    @property
    def sm(self) -> int:
        """The SM version the cubin is for: bits 8-15 of ``e_flags`` (CUDA 13 writes
        0x06005a04 for sm_90, 0x06005004 for sm_80)."""
        return (self.elf_flags >> 8) & 0xFF

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def kernel_names(self) -> list[str]:
        """Entry functions (kernels), in symbol-table order."""
        infos = {
            s.name[len(".nv.info.") :] for s in self.sections if s.name.startswith(".nv.info.")
        }
        return [s.name for s in self.symbols if s.is_function and s.name in infos]

    def module_variables(self) -> list[tuple[str, int]]:
        """``(name, size)`` of every variable in the module's global memory.

        ptxas puts ``__device__`` variables, function-scope ``static`` variables of device code
        and ``__managed__`` stand-ins in ``.nv.global`` (zero-initialised, ``SHT_NOBITS``) or
        ``.nv.global.init`` (with an initialiser), as ``STT_OBJECT`` symbols under their lowered
        names, which ``cuModuleGetGlobal`` accepts.  This is the state a kernel can keep between
        launches of the same module; ``__constant__`` banks are read-only to kernels.
        """
        by_index = {s.index: s for s in self.sections}
        found = []
        for symbol in self.symbols:
            section = by_index.get(symbol.shndx)
            if (symbol.is_object and symbol.size > 0 and section is not None
                    and section.name.startswith(".nv.global")):
                found.append((symbol.name, symbol.size))
        return found

    def nv_info(self, section_name: str) -> list[NvInfoAttribute]:
        section = self.section(section_name)
        return parse_nv_info(section.data) if section else []

    def kernel(self, name: str) -> KernelAttributes:
        """The attributes of kernel ``name`` (its lowered name); :class:`KeyError` if absent."""
        symbol = next((s for s in self.symbols if s.is_function and s.name == name), None)
        if symbol is None or self.section(f".nv.info.{name}") is None:
            raise KeyError(name)
        per_function: dict[int, int] = {}
        for attr in self.nv_info(".nv.info"):
            words = attr.words()
            if attr.format == EIFMT_SVAL and len(words) >= 2 and words[0] == symbol.index:
                per_function[attr.attribute] = words[1]
        max_threads = required = None
        for attr in self.nv_info(f".nv.info.{name}"):
            words = attr.words()
            if attr.format == EIFMT_SVAL and len(words) >= 3:
                if attr.attribute == EIATTR_MAX_THREADS:
                    max_threads = (words[0], words[1], words[2])
                elif attr.attribute == EIATTR_REQNTID:
                    required = (words[0], words[1], words[2])
        return KernelAttributes(
            name=name,
            registers=per_function.get(EIATTR_REGCOUNT),
            frame_bytes=per_function.get(EIATTR_FRAME_SIZE),
            min_stack_bytes=per_function.get(EIATTR_MIN_STACK_SIZE),
            max_stack_bytes=per_function.get(EIATTR_MAX_STACK_SIZE),
            shared_bytes=self._static_shared(name),
            max_threads=max_threads,
            required_threads=required,
        )

    def _static_shared(self, name: str) -> int:
        section = self.section(f".nv.shared.{name}")
        if section is None:
            return 0
        if self.section(_RESERVED_SECTION) is not None:
            return max(section.size - RESERVED_SHARED_BYTES, 0)
        return section.size


def parse_nv_info(data: bytes) -> list[NvInfoAttribute]:
    """The attributes of one ``.nv.info*`` section (see the module docstring for the layout)."""
    attributes = []
    offset = 0
    while offset + 4 <= len(data):
        fmt, attribute, word = struct.unpack_from("<BBH", data, offset)
        offset += 4
        if fmt == EIFMT_SVAL:
            if offset + word > len(data):
                raise CubinError(f"nv.info attribute 0x{attribute:x} runs past its section")
            attributes.append(NvInfoAttribute(fmt, attribute, data[offset : offset + word]))
            offset += (word + 3) & ~3
        else:
            attributes.append(NvInfoAttribute(fmt, attribute, struct.pack("<H", word)))
    return attributes


def code_sha256(image: bytes) -> str:
    """sha256 of everything in the cubin the GPU can observe: the ELF flags and every section's
    name, type, flags and bytes, except ptxas's command-line note (:data:`TOOLKIT_NOTE`).

    Two compiles that differ only in how an option was spelled, in option order, or in an
    implied default (``-Xptxas -O3``) give the same code and therefore the same hash, so the
    replay layer measures that cubin once.  Bytes that are not a cubin hash as they are.
    """
    try:
        cubin = Cubin.parse(image)
    except CubinError:
        return hashlib.sha256(image).hexdigest()
    digest = hashlib.sha256(struct.pack("<I", cubin.elf_flags))
    for section in cubin.sections:
        if section.name == TOOLKIT_NOTE:
            continue
        header = (
            f"{section.name}\0{section.type}\0{section.flags}\0{section.size}\0"
            f"{section.link}\0{section.info}\0"
        ).encode()
        digest.update(struct.pack("<Q", len(header)) + header)
        digest.update(struct.pack("<Q", len(section.data)) + section.data)
    return digest.hexdigest()


def _cstr(table: bytes, offset: int) -> str:
    end = table.index(b"\0", offset)
    return table[offset:end].decode()
