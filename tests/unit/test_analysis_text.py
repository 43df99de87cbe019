"""The one lexical mask every character scan works on (r3tui.analysis.text)."""

from __future__ import annotations

from r3tui.analysis.text import mask

SOURCE = (
    '#include "kernels.cuh"  // the { in here is not code\n'
    "#define SCALE(x) \\\n"
    "  ((x) * 2) /* { */\n"
    "/* a block\n"
    "   comment with k<<<1, 1>>>() */\n"
    "__global__ void k(const char* s) {\n"
    "  char c = '}';\n"
    '  printf("{ %s }\\n", s);\n'
    "  #pragma unroll\n"
    "  for (int i = 0; i < 4; ++i) {}\n"
    "}\n"
)


def test_comments_and_literal_insides_are_blanked_with_offsets_and_lines_kept() -> None:
    masked = mask(SOURCE)
    assert len(masked) == len(SOURCE) and masked.count("\n") == SOURCE.count("\n")
    assert "<<<" not in masked and "comment" not in masked and "not code" not in masked
    # only the kernel's own braces remain, balanced
    assert masked.count("{") == 2 and masked.count("}") == 2
    assert "'" in masked and '"' in masked and "%s" not in masked  # quotes stay, insides go
    assert "#define SCALE(x)" in masked  # directives are code unless asked otherwise


def test_directives_with_their_continuation_lines_become_statement_ends() -> None:
    masked = mask(SOURCE, directives=True)
    lines = masked.split("\n")
    assert lines[0].startswith(";") and not lines[0].strip(" ;")  # the #include line
    assert lines[1].startswith(";") and lines[2].strip() == ""  # SCALE and its continuation
    assert lines[8].strip() == ";"  # #pragma inside the body
    assert "for (int i = 0; i < 4; ++i)" in masked
    # a # that does not start a line is not a directive
    assert mask("int a = 1; # x\n", directives=True) == "int a = 1; # x\n"
    # an unterminated block comment runs to the end
    assert mask("a /* b\nc", directives=True) == "a     \n "


def test_code_key_ignores_comments_and_layout_but_not_code_literals_or_declarations() -> None:
    from r3tui.analysis.text import code_key

    base = 'int x = 1;\n#define A 2\nconst char* s = "a // b";\n'
    assert code_key(base) == code_key(
        '/* header */\nint   x = 1;   // one\n\n#define A 2\n  const char* s = "a // b";\n')
    assert code_key(base) != code_key(base.replace("1;", "2;"))
    assert code_key(base) != code_key(base.replace('"a // b"', '"a b"'))  # literals as written
    assert code_key("c == 'a'") != code_key("c == 'b'")
    # an r3 declaration changes what is searched; a line break ends a directive
    assert code_key("// r3: tune A 1 2\n" + base) != code_key(base)
    assert code_key("#define A 1\nint y;") != code_key("#define A 1 int y;")
