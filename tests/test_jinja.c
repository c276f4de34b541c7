/* test_jinja.c - pins the Jinja interpreter (daemon/engine/jinja.c): each
 * construct, filter and test against the output Python's jinja2 3.1 gives
 * (configured as Hugging Face does: trim_blocks, lstrip_blocks,
 * loopcontrols; the table below was generated with it), whitespace
 * control, errors that name the line, limits that stop a runaway template,
 * garbage that must fail cleanly, and one template rendered from several
 * threads at once.  tests/jinja_compare.py does the same for whole chat
 * templates.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include <json-c/json.h>

#include "jinja.h"
#include "testutil.h"

#define NOW 1721822400 /* 2024-07-24 12:00:00 UTC, as jinja_compare.py */

struct case_ {
	const char *name; /* what it pins */
	const char *src;  /* the template */
	const char *want; /* jinja2's output */
};

/* generated from Python's jinja2 3.1 (see the file's head) */
static const struct case_ cases[] = {
	{ "literals",
	  "{{ 'a\\tb' }}|{{ \"q'\" }}|{{ 1 }}|{{ -2 }}|{{ 1.5 }}|{{ 1e3 }}|{{ 0x1F }}|{{ 1_000 }}|{{ true }}|{{ False }}|{{ none }}|{{ None }}",
	  "a\tb|q'|1|-2|1.5|1000.0|31|1000|True|False|None|None" },
	{ "string escapes",
	  "{{ 'x\\ny\\u00e9\\x41\\\\' }}|{{ 'a' 'b' }}",
	  "x\ny\303\251A\\|ab" },
	{ "print containers",
	  "{{ [1, 'a', none, true, 1.0] }}|{{ {'k': [1, (2,)], 'j': {}} }}|{{ (1, 2) }}|{{ ('x',) }}|{{ () }}|{{ [\"it's\"] }}",
	  "[1, 'a', None, True, 1.0]|{'k': [1, (2,)], 'j': {}}|(1, 2)|('x',)|()|[\"it's\"]" },
	{ "float repr",
	  "{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 3.0 }}|{{ 1/3 }}|{{ -0.0 }}|{{ 123456789.125 }}",
	  "0.30000000000000004|1e+16|1e-05|0.0001|3.0|0.3333333333333333|-0.0|123456789.125" },
	{ "arithmetic",
	  "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 / 2 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 5.5 // 2 }} {{ true + 1 }}",
	  "3 -4 2 -2 1024 0.5 0.5 ababab [1, 1] [1, 2] 2.0 2" },
	{ "precedence",
	  "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 'a' ~ 2 * 3 }} {{ not 1 == 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}",
	  "7 9 64 4 a6 True True False" },
	{ "comparisons",
	  "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'a' in 'cat' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ none == none }} {{ 1 != 2 }} {{ (1, 2) == [1, 2] }}",
	  "True True True True True True True True True False" },
	{ "and or",
	  "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 1 }} {{ none or [] }} {{ not '' }}",
	  "x y  [] True" },
	{ "conditional expr",
	  "{{ 'y' if t else 'n' }}|{{ 'y' if e else 'n' }}|{{ 'y' if e }}|{{ 1 if false else 2 if true else 3 }}",
	  "y|n||2" },
	{ "attributes and items",
	  "{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} {{ d.a }} {{ d['b'] }} {{ l[5] }}|{{ d.zz }}|{{ s[0] }}{{ s[-1] }} {{ u[1] }}",
	  "system Hi  yo  1 2 ||Hd \303\251" },
	{ "slices",
	  "{{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ s[::2] }} {{ u[::-1] }} {{ u[1:4] }} {{ l[5:] }} {{ s[-3:] }} {{ l[::2] }}",
	  "[1, 2] [2, 1, 3] [3, 1] HloWrd dlr\303\266w oll\303\251h \303\251ll [] rld [3, 2]" },
	{ "string methods",
	  "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ s.startswith('He') }}|{{ s.endswith(('x', 'ld')) }}|{{ s.replace('l', 'L') }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}|{{ s.find('o') }}|{{ s.rfind('o') }}|{{ s.count('l') }}|{{ u.find('w') }}",
	  "x|a|a | a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']|True|True|HeLLo WorLd|HELLO WORLD|hello world|Hello World|Hello|4|7|3|6" },
	{ "string methods 2",
	  "{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{0}{x}'.format('a', x=2) }}|{{ '-'.join(['a', 'b']) }}|{{ '12'.isdigit() }}|{{ 'a1'.isalpha() }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'a=b=c'.partition('=') }}|{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}|{{ 'ab'.center(5, '*') }}|{{ '7'.zfill(3) }}|{{ 'Ab'.swapcase() }}",
	  "1 and b|aa2|a-b|True|False|['a', 'b', 'c']|('a', '=', 'b=c')|ab..|  ab|**ab*|007|aB" },
	{ "unicode case",
	  "{{ u.upper() }}|{{ u | title }}|{{ u | length }}|{{ '\303\211COLE' | lower }}",
	  "H\303\211LLO W\303\226RLD|H\303\251llo W\303\266rld|11|\303\251cole" },
	{ "dict methods",
	  "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}|{{ d.get('zz', 7) }}|{{ d.get('zz') }}",
	  "b=2;a=1;c=None;|['b', 'a', 'c']|[2, 1, None]|1|7|None" },
	{ "filters text",
	  "{{ '  x ' | trim }}|{{ 'xax' | trim('x') }}|{{ s | lower }}|{{ s | upper }}|{{ 'hello-world foo' | title }}|{{ 'hELLO' | capitalize }}|{{ s | replace('o', '0') }}|{{ s | replace('l', '', 1) }}|{{ '<a&b>' | e }}|{{ s | wordcount }}|{{ 'abc' | reverse }}|{{ s | center(15) }}|",
	  "x|a|hello world|HELLO WORLD|Hello-World Foo|Hello|Hell0 W0rld|Helo World|&lt;a&amp;b&gt;|2|cba|  Hello World  |" },
	{ "filters seq",
	  "{{ l | length }} {{ l | count }} {{ l | first }} {{ l | last }} {{ l | sort }} {{ l | sort(reverse=true) }} {{ l | join(', ') }} {{ l | sum }} {{ l | min }} {{ l | max }} {{ [1, 1, 2] | unique | list }} {{ l | reverse | list }} {{ l | list }} {{ 'ab' | list }} {{ d | list }} {{ e | first }}|{{ [1, 2, 3, 4, 5] | batch(2) | list }}",
	  "3 3 3 2 [1, 2, 3] [3, 2, 1] 3, 1, 2 6 1 3 [1, 2] [2, 1, 3] [3, 1, 2] ['a', 'b'] ['b', 'a', 'c'] |[[1, 2], [3, 4], [5]]" },
	{ "filters dicts",
	  "{{ d | dictsort }}|{{ d | items | list }}|{{ {'b': 1, 'A': 2} | dictsort }}|{{ {'b': 1, 'a': 2} | dictsort(by='value') }}",
	  "[('a', 1), ('b', 2), ('c', None)]|[('b', 2), ('a', 1), ('c', None)]|[('A', 2), ('b', 1)]|[('b', 1), ('a', 2)]" },
	{ "default",
	  "{{ missing | default('dflt') }}|{{ missing | d('x') }}|{{ '' | default('y') }}|{{ '' | default('y', true) }}|{{ none | default('z') }}|{{ 0 | default(5, boolean=true) }}",
	  "dflt|x||y|None|5" },
	{ "conversions",
	  "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(3) }} {{ '0x1A' | int(base=16) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 'x' | float }} {{ 12 | string }} {{ [1] | string }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(method='ceil') }}",
	  "42 4 0 3 26 3 2.5 2.0 0.0 12 [1] 3 2.57 2.0 4.0 3.0" },
	{ "tojson",
	  "{{ d | tojson }}|{{ [1, '\303\251', none, true, 1.5, \"q\\\"\"] | tojson }}|{{ '\303\251' | tojson(ensure_ascii=true) }}|{{ d | tojson(indent=2) }}|{{ {'b': 1, 'a': [1, {}]} | tojson(sort_keys=true) }}|{{ [] | tojson(indent=4) }}|{{ 'a\\nb\\u0001' | tojson }}|{{ '\360\237\231\202' | tojson(ensure_ascii=true) }}",
	  "{\"b\": 2, \"a\": 1, \"c\": null}|[1, \"\303\251\", null, true, 1.5, \"q\\\"\"]|\"\\u00e9\"|{\n  \"b\": 2,\n  \"a\": 1,\n  \"c\": null\n}|{\"a\": [1, {}], \"b\": 1}|[]|\"a\\nb\\u0001\"|\"\\ud83d\\ude42\"" },
	{ "select map",
	  "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | join(',') }}|{{ [0, 1, 2, none] | select | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ ['a', 'b'] | map('upper') | list }}|{{ messages | map(attribute='x', default='?') | list }}|{{ l | select('gt', 1) | list }}|{{ messages | selectattr('role') | list | length }}",
	  "['Hi']|system,assistant|[1, 2]|[2, 4]|['A', 'B']|['?', '?', '?']|[3, 2]|3" },
	{ "indent",
	  "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, first=true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}",
	  "a\n    b\n\n    c|  a\n  b|a\n> \n> b" },
	{ "format filter",
	  "{{ '%s-%d-%.2f' | format('a', 3, 1.5) }}|{{ '%s' % 'x' }}|{{ '%5s|%-3d|' % ('ab', 7) }}",
	  "a-3-1.50|x|   ab|7  |" },
	{ "tests",
	  "{{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ 'x' is string }} {{ d is mapping }} {{ l is iterable }} {{ l is sequence }} {{ none is none }} {{ missing is defined }} {{ missing is undefined }} {{ t is boolean }} {{ t is true }} {{ 0 is false }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ d is not mapping }} {{ missing is iterable }} {{ missing is sequence }}",
	  "True True True True True True True True True False True True True False True True True True True True True True True True True False True True" },
	{ "if elif else",
	  "{% for i in range(4) %}{% if i == 0 %}zero{% elif i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %} {% endfor %}",
	  "zero one two many " },
	{ "for loop vars",
	  "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }}{{ loop.depth }};{% endfor %}",
	  "1032TrueFalse31a1;2121FalseFalse332b1;3210FalseTrue31a1;" },
	{ "for else and filter",
	  "{% for x in e %}no{% else %}empty{% endfor %}|{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in l if x > 9 %}{{ x }}{% else %}none{% endfor %}",
	  "empty|3222|none" },
	{ "for unpack",
	  "{% for a, b in [(1, 2), [3, 4]] %}{{ a }}{{ b }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'h\303\251' %}[{{ c }}]{% endfor %}|{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}",
	  "1234|bac|[h][\303\251]|a1b2cNone" },
	{ "break continue",
	  "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
	  "0134" },
	{ "nested loops",
	  "{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}",
	  "100 201 1|110 211 2|" },
	{ "set scoping",
	  "{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
	  "111 111 1|5" },
	{ "set tuple",
	  "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, 4 %}{{ c }}",
	  "12(3, 4)" },
	{ "namespace",
	  "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}{% set ns2 = namespace({'a': 1}) %} {{ ns2.a }}",
	  "3 True 1" },
	{ "block set",
	  "{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]{% set y | upper %}low{% endset %}{{ y }}",
	  "[a2b]LOW" },
	{ "macros",
	  "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet() }}|",
	  "Hi a! Hi b? Hi c. Hi !|" },
	{ "macro recursion and globals",
	  "{% set g = 'G' %}{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(4) }} {% macro show() %}{{ g }}{{ messages | length }}{% endmacro %}{{ show() }}",
	  "4*3*2*1 G3" },
	{ "call block",
	  "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ s }}{% endcall %}{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}",
	  "<b>bold Hello World</b><1><2>" },
	{ "filter block with",
	  "{% filter upper %}abc {{ s }}{% endfilter %}|{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}{{ a }}",
	  "ABC HELLO WORLD|1x" },
	{ "raw and comments",
	  "{% raw %}{{ not }} {% this %}{% endraw %}|{# a comment #}x{#- trimmed -#} y",
	  "{{ not }} {% this %}|xy" },
	{ "generation",
	  "{% generation %}gen {{ n }}{% endgeneration %}",
	  "gen 3" },
	{ "whitespace control",
	  "a  {{- ' b ' -}}  c\n{%- if true -%}\n  d\n{%- endif %}\ne",
	  "a b cde" },
	{ "trim_blocks lstrip_blocks",
	  "<ul>\n  {% for x in l %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n  {{ 'kept indent' }}\n",
	  "<ul>\n    <li>3</li>\n    <li>1</li>\n    <li>2</li>\n</ul>\n  kept indent" },
	{ "plus disables",
	  "  {%+ if true %}x{% endif +%}\ny",
	  "  x\ny" },
	{ "comment lstrip",
	  "a\n    {# c #}\nb\n  {#- c2 #}\nc",
	  "a\nbc" },
	{ "crlf source",
	  "{% if true %}\r\nx\r\n{% endif %}\r\ny\r\n",
	  "x\ny" },
	{ "trailing newline kept once",
	  "x\n\n",
	  "x\n" },
	{ "range",
	  "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}",
	  "[0, 1, 2] [1, 3, 5] [5, 3, 1] []" },
	{ "dict literal and dict()",
	  "{{ {'a': 1, 'b': 2}['b'] }} {{ dict(x=1, y=2) }} {{ dict(x=1).x }}",
	  "2 {'x': 1, 'y': 2} 1" },
	{ "undefined behaviour",
	  "[{{ missing }}][{{ missing | length }}][{{ missing | trim }}][{{ missing ~ 'x' }}][{% for x in missing %}no{% endfor %}][{{ missing is defined }}][{{ missing == missing }}][{{ d.zz is defined }}][{{ none.x is defined }}][{{ l[9] is defined }}]",
	  "[][0][][x][][False][True][False][False][False]" },
	{ "markup safe",
	  "{{ '<b>' | safe + '<i>' }}|{{ '<x>' + ('y' | safe) }}|{{ ('a' | safe) ~ '<' }}",
	  "<b>&lt;i&gt;|&lt;x&gt;y|a<" },
	{ "strftime",
	  "{{ strftime_now('%Y-%m-%d %H:%M %b %A') }}",
	  "2024-07-24 12:00 Jul Wednesday" },
	{ "loop changed",
	  "{% for x in [1, 1, 2, 2, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}",
	  "123" },
	{ "chained filters and tests",
	  "{{ messages | map(attribute='content') | map('trim') | join('|') | upper }} {{ (messages | length) is even }} {{ -l | length if false else l | length }}",
	  "SYS|HI|YO False 3" },
	{ "is not and in chain",
	  "{% if messages[0].role is not equalto 'user' and 'sys' in messages[0].content %}ok{% endif %}",
	  "ok" },
	{ "string comparison ops",
	  "{{ 'abc' < 'abd' }} {{ 'b' > 'abc' }} {{ 'a' <= 'a' }} {{ [2] >= [1, 9] }}",
	  "True True True True" },
	{ "list methods",
	  "{{ l.index(1) }} {{ l.count(3) }} {{ l.copy() }}",
	  "1 1 [3, 1, 2]" },
	{ "repr escapes",
	  "{{ ['a\\nb', 'tab\\t', 'back\\\\', 'q\"', '\\x01', '\303\251'] }}",
	  "['a\\nb', 'tab\\t', 'back\\\\', 'q\"', '\\x01', '\303\251']" },
};
static const char ctx_json[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \" yo \"}], \"n\": 3, \"f\": 2.5, \"s\": \"Hello World\", \"d\": {\"b\": 2, \"a\": 1, \"c\": null}, \"l\": [3, 1, 2], \"e\": [], \"u\": \"h\303\251llo w\303\266rld\", \"t\": true}";

/* Compiles and renders SRC with CTX (JSON text or NULL) under LIM (NULL =
 * defaults, with the fixed clock).  Returns the render's code; *OUT gets
 * the text (free it) or NULL, ERR the message. */
static int render(const char *src, const char *ctx, const struct jinja_limits *lim, char **out,
		  char *err, size_t errlen)
{
	struct jinja_template *t = NULL;
	struct jinja_limits l;
	json_object *c = ctx ? json_tokener_parse(ctx) : NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if (lim) {
		l = *lim;
	} else {
		jinja_limits_default(&l);
		l.now = NOW;
	}
	rc = jinja_compile(src, strlen(src), &t, err, errlen);
	if (rc == 0) {
		rc = jinja_render(t, c, &l, out, &len, err, errlen);
		if (rc == 0)
			CHECK_INT_EQ(len, strlen(*out));
	}
	jinja_free(t);
	json_object_put(c);
	return rc;
}

static void test_cases(void)
{
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char err[256], *out;
		int rc = render(cases[i].src, ctx_json, NULL, &out, err, sizeof err);
		if (rc != 0 || strcmp(out, cases[i].want) != 0) {
			fprintf(stderr, "case '%s': rc %d (%s)\n  got:  \"%s\"\n  want: \"%s\"\n", cases[i].name, rc,
				err, out ? out : "(none)", cases[i].want);
			test_failures++;
		}
		free(out);
	}
}

/* Renders SRC with the default context and checks it fails with CODE and a
 * message that contains WANT. */
static void check_error(const char *src, int code, const char *want)
{
	char err[256] = "", *out;
	int rc = render(src, ctx_json, NULL, &out, err, sizeof err);
	CHECK_INT_EQ(rc, code);
	CHECK(code == 0 || out == NULL);
	if (!strstr(err, want)) {
		fprintf(stderr, "%s:%d: error for \"%s\" is \"%s\", expected it to contain \"%s\"\n",
			__FILE__, __LINE__, src, err, want);
		test_failures++;
	}
	free(out);
}

static void test_errors(void)
{
	/* syntax: the line of the fault */
	check_error("a\nb\n{% if x %}\nc", -EINVAL, "line 4: unexpected end of template: expected 'elif' or 'else' or 'endif'");
	check_error("{{ 1 +", -EINVAL, "line 1: unexpected");
	check_error("x\n{{ 'abc }}", -EINVAL, "line 2: unterminated string");
	check_error("\n\n{{ x | nosuchfilter }}", -EINVAL, "line 3: unsupported filter 'nosuchfilter'");
	check_error("{{ x is nosuchtest }}", -EINVAL, "line 1: unsupported test 'nosuchtest'");
	check_error("{% include 'x.html' %}", -EINVAL, "line 1: unsupported tag 'include'");
	check_error("{% extends 'base' %}", -EINVAL, "unsupported tag 'extends'");
	check_error("{% for x in y recursive %}{% endfor %}", -EINVAL, "recursive loops");
	check_error("{% break %}", -EINVAL, "'break' outside a for loop");
	check_error("{% endfor %}", -EINVAL, "unexpected 'endfor'");
	check_error("{% if a %}{% endfor %}", -EINVAL, "line 1: unexpected 'endfor'");
	check_error("{# never closed", -EINVAL, "missing end of comment tag");
	check_error("{% raw %}never closed", -EINVAL, "missing end of raw directive");
	check_error("{{ (1 ] }}", -EINVAL, "unexpected ']', expected ')'");
	check_error("{{ f(a=1, 2) }}", -EINVAL, "positional argument after a keyword argument");
	check_error("{% set true = 1 %}", -EINVAL, "cannot assign");
	check_error("{{ 99999999999999999999 }}", -EINVAL, "integer literal too large");
	check_error("{{ '\\x4' }}", -EINVAL, "truncated \\x escape");
	check_error("{{ f(*args) }}", -EINVAL, "*args");
	check_error("{{ @ }}", -EINVAL, "unexpected character '@'");
	/* an unknown filter inside an if compiles, as in jinja2, and fails when run */
	check_error("{% if false %}{{ x | nope }}{% endif %}ok", 0, "");
	check_error("line1\n{% if true %}{{ x | nope }}{% endif %}", -EINVAL, "line 2: No filter named 'nope'");

	/* runtime: the line, what failed */
	check_error("\n\n{{ raise_exception('Conversation roles must alternate') }}", -EINVAL,
		    "line 3: raise_exception: Conversation roles must alternate");
	check_error("{{ missing.attr }}", -EINVAL, "line 1: 'missing' is undefined");
	check_error("{{ messages[9].role }}", -EINVAL, "line 1: list object has no element 9");
	check_error("{{ 'a' + 1 }}", -EINVAL, "unsupported operand type(s) for +: 'str' and 'int'");
	check_error("{{ 1 / 0 }}", -EINVAL, "division by zero");
	check_error("{{ 1 < 'a' }}", -EINVAL, "'<' not supported");
	check_error("{% for x in none %}{% endfor %}", -EINVAL, "'NoneType' object is not iterable");
	check_error("{% for x in 5 %}{% endfor %}", -EINVAL, "'int' object is not iterable");
	check_error("{{ l.append(4) }}", -EINVAL, "access to attribute 'append' of 'list' object is unsafe");
	check_error("{{ d.pop('a') }}", -EINVAL, "unsafe");
	check_error("{{ missing() }}", -EINVAL, "'missing' is undefined");
	check_error("{{ n() }}", -EINVAL, "'int' object is not callable");
	check_error("{{ d | tojson(nope=1) }}", -EINVAL, "unexpected keyword argument 'nope'");
	check_error("{{ missing | tojson }}", -EINVAL, "Object of type Undefined is not JSON serializable");
	check_error("{{ l | map('upper') | tojson }}", -EINVAL, "generator");
	check_error("{{ l | select | length }}", -EINVAL, "has no len()");
	check_error("{% set a, b = [1, 2, 3] %}", -EINVAL, "too many values to unpack");
	check_error("{% set n.x = 1 %}", -EINVAL, "non-namespace object");
	check_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", -EINVAL, "takes not more than 1 argument");
	check_error("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", -EINVAL, "no keyword argument 'b'");
	check_error("{{ range(1000000) | length }}", -EINVAL, "Range too big");
	check_error("{{ 9223372036854775807 + 1 }}", -EINVAL, "integer overflow");
	check_error("{{ 'x'.split('') }}", -EINVAL, "empty separator");
	check_error("{{ '{}{}'.format(1) }}", -EINVAL, "out of range");
	check_error("{{ '%d' % 'x' }}", -EINVAL, "a number is required");
}

static void check_limit(const char *src, const struct jinja_limits *lim, const char *want)
{
	char err[256] = "", *out;
	int rc = render(src, ctx_json, lim, &out, err, sizeof err);
	CHECK_INT_EQ(rc, -E2BIG);
	CHECK(out == NULL);
	if (!strstr(err, want)) {
		fprintf(stderr, "%s:%d: limit error for \"%s\" is \"%s\", expected \"%s\"\n", __FILE__,
			__LINE__, src, err, want);
		test_failures++;
	}
	free(out);
}

static void test_limits(void)
{
	struct jinja_limits lim;
	jinja_limits_default(&lim);
	CHECK_INT_EQ(lim.max_steps, JINJA_MAX_STEPS);
	CHECK_INT_EQ(lim.max_depth, JINJA_MAX_DEPTH);
	CHECK_INT_EQ(lim.max_output, JINJA_MAX_OUTPUT);
	CHECK_INT_EQ(lim.max_memory, JINJA_MAX_MEMORY);

	/* 10^15 turns of a loop stop at the step limit, quickly */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	check_limit("{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}"
		    "{% endfor %}{% endfor %}{% endfor %}", NULL, "more than 20000000 steps");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK((t1.tv_sec - t0.tv_sec) < 120); /* ~1 s; valgrind takes ~60 */

	/* endless recursion stops at the depth limit */
	check_limit("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested more than 64 deep");

	/* output and memory */
	lim.max_output = 1000;
	check_limit("{% for i in range(200) %}0123456789{% endfor %}", &lim, "longer than 1000 bytes");
	check_limit("{% set x %}{% for i in range(200) %}0123456789{% endfor %}{% endset %}", &lim,
		    "longer than 1000 bytes");
	jinja_limits_default(&lim);
	lim.max_memory = 4 << 20;
	check_limit("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
		    "{% endfor %}", &lim, "more than 4194304 bytes of memory");
	check_limit("{{ 'x' * 100000000 }}", &lim, "bytes of memory");
	jinja_limits_default(&lim);
	lim.max_steps = 1000;
	check_limit("{% for i in range(10000) %}{% endfor %}", &lim, "more than 1000 steps");

	/* a source nested too deeply fails at compile time */
	char deep[4096];
	size_t k = 0;
	k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
	for (int i = 0; i < 1000; i++)
		deep[k++] = '(';
	deep[k++] = '1';
	for (int i = 0; i < 1000; i++)
		deep[k++] = ')';
	snprintf(deep + k, sizeof deep - k, " }}");
	struct jinja_template *t = (struct jinja_template *)&lim;
	char err[256];
	CHECK_INT_EQ(jinja_compile(deep, strlen(deep), &t, err, sizeof err), -EINVAL);
	CHECK(t == (struct jinja_template *)&lim); /* untouched on failure */
	k = 0;
	for (int i = 0; i < 300; i++)
		k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
	CHECK_INT_EQ(jinja_compile(deep, strlen(deep), &t, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "nested too deeply") != NULL);
}

static void test_api(void)
{
	struct jinja_template *t;
	char err[128], *out = (char *)&err;
	size_t len = 99;
	CHECK_INT_EQ(jinja_compile("", 0, &t, err, sizeof err), 0);
	CHECK_INT_EQ(jinja_render(t, NULL, NULL, &out, &len, err, sizeof err), 0);
	CHECK_INT_EQ(len, 0);
	CHECK_STR_EQ(out, "");
	free(out);
	json_object *arr = json_object_new_array();
	out = (char *)&err;
	CHECK_INT_EQ(jinja_render(t, arr, NULL, &out, &len, err, sizeof err), -EINVAL);
	CHECK(out == (char *)&err);
	json_object_put(arr);
	CHECK_INT_EQ(jinja_render(NULL, NULL, NULL, &out, &len, err, sizeof err), -EINVAL);
	CHECK_INT_EQ(jinja_render(t, NULL, NULL, NULL, &len, err, sizeof err), -EINVAL);
	jinja_free(t);
	jinja_free(NULL);
	CHECK_INT_EQ(jinja_compile(NULL, 0, NULL, err, sizeof err), -EINVAL);
	/* no error buffer: still fine */
	CHECK_INT_EQ(jinja_compile("{% if %}", 8, &t, NULL, 0), -EINVAL);
	/* the source need not be NUL-terminated: LEN bounds it */
	CHECK_INT_EQ(jinja_compile("{{ 1 }}{{ oops", 7, &t, err, sizeof err), 0);
	CHECK_INT_EQ(jinja_render(t, NULL, NULL, &out, &len, err, sizeof err), 0);
	CHECK_STR_EQ(out, "1");
	free(out);
	jinja_free(t);
	/* a context value with a NUL byte goes through whole */
	CHECK_INT_EQ(jinja_compile("[{{ s }}]", 9, &t, err, sizeof err), 0);
	json_object *ctx = json_tokener_parse("{\"s\": \"a\\u0000b\"}");
	CHECK_INT_EQ(jinja_render(t, ctx, NULL, &out, &len, err, sizeof err), 0);
	CHECK_INT_EQ(len, 5);
	CHECK(memcmp(out, "[a\0b]", 5) == 0);
	free(out);
	json_object_put(ctx);
	jinja_free(t);
}

/* Garbage: random bytes, and real templates with bytes flipped, cut or
 * spliced.  Each must compile and render, or fail with a message; never
 * crash or hang (ASan and valgrind runs of this test check for leaks). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void fuzz_one(const char *src, size_t len, json_object *ctx)
{
	struct jinja_template *t = NULL;
	struct jinja_limits lim;
	char err[256], *out;
	size_t out_len;
	jinja_limits_default(&lim);
	lim.max_steps = 200000;
	lim.max_memory = 16 << 20;
	lim.now = NOW;
	err[0] = '\0';
	int rc = jinja_compile(src, len, &t, err, sizeof err);
	if (rc < 0) {
		CHECK(rc == -EINVAL || rc == -E2BIG);
		CHECK(strncmp(err, "line ", 5) == 0);
		return;
	}
	rc = jinja_render(t, ctx, &lim, &out, &out_len, err, sizeof err);
	if (rc == 0)
		free(out);
	else
		CHECK(rc == -EINVAL || rc == -E2BIG);
	jinja_free(t);
}

static void test_garbage(void)
{
	static const char *const seeds[] = {
		"{%- for message in messages %}{%- if loop.first and message.role != 'system' %}"
		"{{- '<|im_start|>system\\nDefault<|im_end|>\\n' }}{%- endif %}{{- '<|im_start|>' + "
		"message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}{%- endfor %}"
		"{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
		"{% set ns = namespace(x=[]) %}{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}"
		"{% for k, v in d | dictsort if v is not none %}{{ m(k) }}{{ v | tojson(indent=2) }}"
		"{% set ns.x = ns.x + [k] %}{% else %}none{% endfor %}{{ ns.x | join(', ') }}"
		"{{ s[1:-1] | upper | replace('L', '_') }}{# c #}{% raw %}{{ }}{% endraw %}",
		"{% call(x) m([1, 2]) %}{{ x }}{% endcall %}{% filter lower %}ABC{% endfilter %}"
		"{{ '%s=%d' % ('a', 1) }}{{ '{}'.format(l) }}{{ u.split()[0] }}{{ range(3)|list }}",
	};
	const char alphabet[] = "{}%#-+()[]'\"|.,:=~ \nabcdefnoirsetlm0123456789_*/<>!";
	json_object *ctx = json_tokener_parse(ctx_json);
	char buf[1024];
	for (int iter = 0; iter < 30000; iter++) {
		const char *seed = seeds[rng() % 3];
		size_t n = strlen(seed);
		if (n > sizeof buf)
			n = sizeof buf;
		memcpy(buf, seed, n);
		int kind = (int)(rng() % 4);
		if (kind == 0) { /* random bytes */
			n = rng() % 200;
			for (size_t i = 0; i < n; i++)
				buf[i] = (char)(rng() & 0xff);
		} else if (kind == 1) { /* random characters of the language */
			n = rng() % 300;
			for (size_t i = 0; i < n; i++)
				buf[i] = alphabet[rng() % (sizeof alphabet - 1)];
		} else { /* a real template, mutated */
			int muts = 1 + (int)(rng() % 4);
			for (int m = 0; m < muts && n; m++) {
				size_t at = rng() % n;
				switch (rng() % 3) {
				case 0: buf[at] = alphabet[rng() % (sizeof alphabet - 1)]; break;
				case 1: n = at; break;
				default: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;
				}
			}
		}
		fuzz_one(buf, n, ctx);
	}
	json_object_put(ctx);
}

/* One compiled template, rendered by several threads at once, gives each
 * the same text. */
struct thread_arg {
	const struct jinja_template *t;
	json_object *ctx;
	const char *want;
	int bad;
};

static void *render_thread(void *p)
{
	struct thread_arg *a = p;
	for (int i = 0; i < 200; i++) {
		char *out, err[128];
		size_t len;
		if (jinja_render(a->t, a->ctx, NULL, &out, &len, err, sizeof err) != 0) {
			a->bad++;
			continue;
		}
		a->bad += strcmp(out, a->want) != 0;
		free(out);
	}
	return NULL;
}

static void test_threads(void)
{
	static const char src[] =
		"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
		"<{{ m.role | upper }}>{{ m.content | trim }}{{ loop.index }}{% endfor %}{{ ns.n }}"
		"{{ d | tojson }}{{ u | title }}";
	struct jinja_template *t;
	char err[128], *want;
	size_t len;
	json_object *ctx = json_tokener_parse(ctx_json);
	CHECK_INT_EQ(jinja_compile(src, strlen(src), &t, err, sizeof err), 0);
	CHECK_INT_EQ(jinja_render(t, ctx, NULL, &want, &len, err, sizeof err), 0);
	CHECK_STR_EQ(want, "<SYSTEM>sys1<USER>Hi2<ASSISTANT>yo33{\"b\": 2, \"a\": 1, \"c\": null}Héllo Wörld");
	pthread_t th[4];
	struct thread_arg args[4];
	for (int i = 0; i < 4; i++) {
		/* each thread its own context object: json-c's are not thread-safe */
		args[i] = (struct thread_arg){ t, json_tokener_parse(ctx_json), want, 0 };
		CHECK_INT_EQ(pthread_create(&th[i], NULL, render_thread, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK_INT_EQ(args[i].bad, 0);
		json_object_put(args[i].ctx);
	}
	free(want);
	json_object_put(ctx);
	jinja_free(t);
}

int main(void)
{
	setenv("TZ", "UTC", 1);
	tzset();
	test_cases();
	test_errors();
	test_limits();
	test_api();
	test_garbage();
	test_threads();
	return test_result();
}
