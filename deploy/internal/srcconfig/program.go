package srcconfig

import (
	"errors"
	"fmt"
	"go/ast"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// envconfPath is the package that fills Config structs from the environment: its reads are
// the variables of the struct types it is instantiated with.
const envconfPath = ModulePrefix + "pkg/envconf"

// Program is a command's main package with every package of the repository it imports,
// directly or not: their non-test files, which are what the binary runs.
type Program struct {
	r    *Reader
	dir  string
	pkgs []*pkg

	locs      map[ast.Node]loc             // functions and calls: where they are
	funcOf    map[*ast.Field]ast.Node      // parameter -> its *ast.FuncDecl or *ast.FuncLit
	litObj    map[*ast.FuncLit]*ast.Object // a function literal assigned to a variable
	calls     []*ast.CallExpr
	assigns   map[*ast.Object][]ast.Expr            // var = value, after the declaration
	fieldSets map[*ast.Object]map[string][]ast.Expr // var.Field = value
	adapters  map[*ast.FuncLit]bool                 // literals handed to envconf as getenv
}

type loc struct {
	p *pkg
	f *ast.File
}

// Program reads the main package in dir (relative to the root) and the packages of the
// repository it imports.
func (r *Reader) Program(dir string) (*Program, error) {
	pr := &Program{r: r, dir: dir, locs: map[ast.Node]loc{}, funcOf: map[*ast.Field]ast.Node{}, litObj: map[*ast.FuncLit]*ast.Object{},
		assigns: map[*ast.Object][]ast.Expr{}, fieldSets: map[*ast.Object]map[string][]ast.Expr{}, adapters: map[*ast.FuncLit]bool{}}
	seen := map[string]bool{}
	queue := []string{filepath.Join(r.root, dir)}
	for len(queue) > 0 {
		d := filepath.Clean(queue[0])
		queue = queue[1:]
		if seen[d] {
			continue
		}
		seen[d] = true
		p, err := r.load(d)
		if err != nil {
			return nil, err
		}
		pr.pkgs = append(pr.pkgs, p)
		for _, imps := range p.imports {
			for _, path := range imps {
				if strings.HasPrefix(path, ModulePrefix) {
					queue = append(queue, filepath.Join(r.root, strings.TrimPrefix(path, ModulePrefix)))
				}
			}
		}
	}
	sort.Slice(pr.pkgs, func(i, j int) bool { return pr.pkgs[i].dir < pr.pkgs[j].dir })
	for _, p := range pr.pkgs {
		for _, f := range p.files {
			pr.index(loc{p, f})
		}
	}
	return pr, nil
}

func (pr *Program) index(l loc) {
	ast.Inspect(l.f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			pr.locs[n] = l
			pr.params(n, n.Type)
		case *ast.FuncLit:
			pr.locs[n] = l
			pr.params(n, n.Type)
		case *ast.CallExpr:
			pr.locs[n] = l
			pr.calls = append(pr.calls, n)
			if pr.isEnvconf(n.Fun, l) {
				for _, a := range n.Args {
					if lit, ok := a.(*ast.FuncLit); ok {
						pr.adapters[lit] = true
					}
				}
			}
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				var rhs ast.Expr
				if len(n.Rhs) == len(n.Lhs) {
					rhs = n.Rhs[i]
				}
				switch x := lhs.(type) {
				case *ast.Ident:
					if x.Obj == nil || rhs == nil {
						continue
					}
					if lit, ok := rhs.(*ast.FuncLit); ok && n.Tok == token.DEFINE {
						pr.litObj[lit] = x.Obj
					}
					if n.Tok == token.ASSIGN {
						pr.assigns[x.Obj] = append(pr.assigns[x.Obj], rhs)
					}
				case *ast.SelectorExpr:
					if id, ok := x.X.(*ast.Ident); ok && id.Obj != nil && rhs != nil && n.Tok == token.ASSIGN {
						if pr.fieldSets[id.Obj] == nil {
							pr.fieldSets[id.Obj] = map[string][]ast.Expr{}
						}
						pr.fieldSets[id.Obj][x.Sel.Name] = append(pr.fieldSets[id.Obj][x.Sel.Name], rhs)
					}
				}
			}
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if i < len(n.Values) && name.Obj != nil {
					if lit, ok := n.Values[i].(*ast.FuncLit); ok {
						pr.litObj[lit] = name.Obj
					}
				}
			}
		}
		return true
	})
}

func (pr *Program) params(fn ast.Node, ft *ast.FuncType) {
	if ft.Params == nil {
		return
	}
	for _, f := range ft.Params.List {
		pr.funcOf[f] = fn
	}
}

// importPath is the package a local name stands for in l's file, or "".
func importPath(l loc, name string) string { return l.p.imports[l.f][name] }

// isEnvconf reports whether fun is envconf.Load[T] or envconf.Parse[T].
func (pr *Program) isEnvconf(fun ast.Expr, l loc) bool {
	_, ok := envconfType(fun, l)
	return ok
}

func envconfType(fun ast.Expr, l loc) (ast.Expr, bool) {
	ix, ok := fun.(*ast.IndexExpr)
	if !ok {
		return nil, false
	}
	sel, ok := ix.X.(*ast.SelectorExpr)
	if !ok {
		return nil, false
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok || importPath(l, x.Name) != envconfPath || (sel.Sel.Name != "Load" && sel.Sel.Name != "Parse") {
		return nil, false
	}
	return ix.Index, true
}

// EnvVars returns every environment variable the program reads, with its default ("" when
// none): the fields of each struct type envconf.Load or envconf.Parse fills (with their
// envDefault), and the constant names given to os.Getenv, os.LookupEnv, a getenv function
// and an environment map (environ["NAME"]). A read whose name it cannot tell is an error.
func (pr *Program) EnvVars() (map[string]string, error) {
	vars := map[string]string{}
	var errs []error
	for _, p := range pr.pkgs {
		for _, f := range p.files {
			l := loc{p, f}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					if t, ok := envconfType(n.Fun, l); ok {
						dir, name, ok := pr.r.structType(p.dir, f, p, t)
						if !ok {
							errs = append(errs, fmt.Errorf("%s: cannot find the struct type envconf fills", pr.pos(n)))
							return true
						}
						if err := pr.r.walk(dir, name, "", vars, 0); err != nil {
							errs = append(errs, err)
						}
						return true
					}
					if p.path != envconfPath && len(n.Args) > 0 && isEnvRead(n.Fun, l) {
						errs = append(errs, pr.addRead(vars, n.Args[0], l, n)...)
					}
				case *ast.IndexExpr:
					if p.path != envconfPath && isEnvMap(n.X) {
						errs = append(errs, pr.addRead(vars, n.Index, l, n)...)
					}
				}
				return true
			})
		}
	}
	return vars, errors.Join(errs...)
}

func (pr *Program) addRead(vars map[string]string, name ast.Expr, l loc, at ast.Node) []error {
	vals, err := pr.eval(name, l, nil, 0)
	if err != nil {
		if pr.inAdapter(at, l) {
			return nil // the environment handed to envconf: its reads are the struct's
		}
		return []error{fmt.Errorf("%s: cannot tell which environment variable is read: %w", pr.pos(at), err)}
	}
	for _, v := range vals {
		if _, ok := vars[v.s]; !ok {
			vars[v.s] = ""
		}
	}
	return nil
}

// inAdapter reports whether n lies in a function literal handed to envconf.
func (pr *Program) inAdapter(n ast.Node, l loc) bool {
	for lit := range pr.adapters {
		if pr.locs[lit].f == l.f && lit.Pos() <= n.Pos() && n.End() <= lit.End() {
			return true
		}
	}
	return false
}

// isEnvRead: os.Getenv, os.LookupEnv, or a function value whose name says it reads the
// environment (getenv, lookupEnv).
func isEnvRead(fun ast.Expr, l loc) bool {
	switch f := fun.(type) {
	case *ast.SelectorExpr:
		x, ok := f.X.(*ast.Ident)
		return ok && importPath(l, x.Name) == "os" && (f.Sel.Name == "Getenv" || f.Sel.Name == "LookupEnv")
	case *ast.Ident:
		name := strings.ToLower(f.Name)
		if !strings.Contains(name, "getenv") && !strings.Contains(name, "lookupenv") {
			return false
		}
		_, isFunc := declOf(f).(*ast.FuncDecl)
		return !isFunc // a function declared so is not the environment itself
	}
	return false
}

// isEnvMap: an identifier of type map[string]string whose name says it is the environment.
func isEnvMap(x ast.Expr) bool {
	id, ok := x.(*ast.Ident)
	if !ok || !strings.Contains(strings.ToLower(id.Name), "env") || id.Obj == nil {
		return false
	}
	var typ ast.Expr
	switch d := id.Obj.Decl.(type) {
	case *ast.Field:
		typ = d.Type
	case *ast.ValueSpec:
		typ = d.Type
	case *ast.AssignStmt: // environ := map[string]string{…} or make(map[string]string)
		if i := identIndex(d.Lhs, id.Name); i >= 0 && len(d.Rhs) == len(d.Lhs) {
			switch rhs := d.Rhs[i].(type) {
			case *ast.CompositeLit:
				typ = rhs.Type
			case *ast.CallExpr:
				if fn, ok := rhs.Fun.(*ast.Ident); ok && fn.Name == "make" && len(rhs.Args) > 0 {
					typ = rhs.Args[0]
				}
			}
		}
	}
	m, ok := typ.(*ast.MapType)
	if !ok {
		return false
	}
	k, ok1 := m.Key.(*ast.Ident)
	v, ok2 := m.Value.(*ast.Ident)
	return ok1 && ok2 && k.Name == "string" && v.Name == "string"
}

func declOf(id *ast.Ident) any {
	if id.Obj == nil {
		return nil
	}
	return id.Obj.Decl
}

// metricOpts are the client_golang option structs whose Namespace, Subsystem and Name make
// a metric's name.
var metricOpts = map[string]bool{"Opts": true, "CounterOpts": true, "GaugeOpts": true, "HistogramOpts": true, "SummaryOpts": true,
	"UntypedOpts": true}

const promPath = "github.com/prometheus/client_golang/prometheus"

// Metrics returns the name of every metric the program defines, each with where it is
// defined: the prometheus.*Opts literals (Namespace, Subsystem and Name joined as
// prometheus.BuildFQName does) and the prometheus.NewDesc calls. A name given through a
// function's parameters is followed to every call of it in the program, a struct field to
// the literal or assignment that sets it. A name it cannot tell is an error.
func (pr *Program) Metrics() (map[string]string, error) {
	out := map[string]string{}
	var errs []error
	add := func(vals []val, at ast.Node) {
		for _, v := range vals {
			if v.s == "" {
				errs = append(errs, fmt.Errorf("%s: a metric without a name", pr.pos(at)))
				continue
			}
			if _, ok := out[v.s]; !ok {
				out[v.s] = pr.pos(at)
			}
		}
	}
	for _, p := range pr.pkgs {
		for _, f := range p.files {
			l := loc{p, f}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					if sel, ok := n.Type.(*ast.SelectorExpr); ok && isPkgSel(sel, l, promPath) && metricOpts[sel.Sel.Name] {
						vals, err := pr.fqName(func(field string) ast.Expr { return keyed(n, field) }, l, nil)
						if err != nil {
							errs = append(errs, fmt.Errorf("%s: cannot tell the metric's name: %w", pr.pos(n), err))
						}
						add(vals, n)
					}
				case *ast.CallExpr:
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && isPkgSel(sel, l, promPath) && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
						vals, err := pr.eval(n.Args[0], l, nil, 0)
						if err != nil {
							errs = append(errs, fmt.Errorf("%s: cannot tell the metric's name: %w", pr.pos(n), err))
						}
						add(vals, n)
					}
				}
				return true
			})
		}
	}
	return out, errors.Join(errs...)
}

func isPkgSel(sel *ast.SelectorExpr, l loc, path string) bool {
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Obj == nil && importPath(l, x.Name) == path
}

// keyed returns the value of field in a keyed struct literal, or nil.
func keyed(lit *ast.CompositeLit, field string) ast.Expr {
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
				return kv.Value
			}
		}
	}
	return nil
}

// fqName evaluates Namespace, Subsystem and Name together, so that the three come from the
// same calls of the functions they pass through.
func (pr *Program) fqName(field func(string) ast.Expr, l loc, b binding) ([]val, error) {
	parts := []val{{b: b}}
	for _, name := range []string{"Namespace", "Subsystem", "Name"} {
		var next []val
		for _, pv := range parts {
			e := field(name)
			if e == nil {
				next = append(next, val{s: join(pv.s, ""), b: pv.b})
				continue
			}
			vals, err := pr.eval(e, l, pv.b, 0)
			if err != nil {
				return nil, err
			}
			for _, v := range vals {
				next = append(next, val{s: join(pv.s, v.s), b: v.b})
			}
		}
		parts = next
	}
	return parts, nil
}

// join adds one part of a name as prometheus.BuildFQName does: empty parts are left out.
func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "_" + b
}

// A binding holds, for each function a value came through, the call it came from.
type binding map[ast.Node]*ast.CallExpr

func (b binding) with(fn ast.Node, call *ast.CallExpr) binding {
	nb := make(binding, len(b)+1)
	for k, v := range b {
		nb[k] = v
	}
	nb[fn] = call
	return nb
}

// val is one value an expression may have, with the calls it assumes.
type val struct {
	s string
	b binding
}

const maxDepth = 24

// eval returns the string values x may have at l.
func (pr *Program) eval(x ast.Expr, l loc, b binding, depth int) ([]val, error) {
	if depth > maxDepth {
		return nil, errors.New("too many steps")
	}
	depth++
	switch x := x.(type) {
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return nil, fmt.Errorf("%s is not a string", x.Value)
		}
		s, err := strconv.Unquote(x.Value)
		return []val{{s, b}}, err
	case *ast.ParenExpr:
		return pr.eval(x.X, l, b, depth)
	case *ast.BinaryExpr:
		if x.Op != token.ADD {
			return nil, fmt.Errorf("operator %s", x.Op)
		}
		left, err := pr.eval(x.X, l, b, depth)
		if err != nil {
			return nil, err
		}
		var out []val
		for _, lv := range left {
			right, err := pr.eval(x.Y, l, lv.b, depth)
			if err != nil {
				return nil, err
			}
			for _, rv := range right {
				out = append(out, val{lv.s + rv.s, rv.b})
			}
		}
		return out, nil
	case *ast.CallExpr:
		if sel, ok := x.Fun.(*ast.SelectorExpr); ok && isPkgSel(sel, l, promPath) && sel.Sel.Name == "BuildFQName" && len(x.Args) == 3 {
			return pr.fqName(func(f string) ast.Expr {
				return map[string]ast.Expr{"Namespace": x.Args[0], "Subsystem": x.Args[1], "Name": x.Args[2]}[f]
			}, l, b)
		}
		return nil, fmt.Errorf("%s: a call's result", pr.pos(x))
	case *ast.Ident:
		return pr.evalIdent(x, l, b, depth)
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok && id.Obj == nil {
			if path := importPath(l, id.Name); path != "" {
				return pr.evalPkgValue(path, x.Sel.Name, b, depth)
			}
		}
		return pr.evalField(x.X, x.Sel.Name, l, b, depth)
	}
	return nil, fmt.Errorf("%s: an expression of type %T", pr.pos(x), x)
}

func (pr *Program) evalIdent(x *ast.Ident, l loc, b binding, depth int) ([]val, error) {
	if x.Obj == nil { // declared in another file of the package
		ref, ok := l.p.values[x.Name]
		if !ok {
			return nil, fmt.Errorf("%s: %s is not a constant of the package", pr.pos(x), x.Name)
		}
		return pr.evalSpec(ref, loc{l.p, l.p.fileOf[ref.spec]}, b, depth)
	}
	var out []val
	switch d := x.Obj.Decl.(type) {
	case *ast.ValueSpec:
		for i, n := range d.Names {
			if n.Name == x.Name {
				vals, err := pr.evalSpec(valueRef{d, i}, l, b, depth)
				if err != nil {
					return nil, err
				}
				out = append(out, vals...)
			}
		}
	case *ast.AssignStmt:
		i := identIndex(d.Lhs, x.Name)
		switch {
		case len(d.Rhs) == 1 && isRange(d.Rhs[0]) && i == 1:
			elems, err := pr.elems(d.Rhs[0].(*ast.UnaryExpr).X, l, depth)
			if err != nil {
				return nil, err
			}
			for _, e := range elems {
				vals, err := pr.eval(e, l, b, depth)
				if err != nil {
					return nil, err
				}
				out = append(out, vals...)
			}
		case i >= 0 && len(d.Rhs) == len(d.Lhs):
			vals, err := pr.eval(d.Rhs[i], l, b, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, vals...)
		default:
			return nil, fmt.Errorf("%s: %s is not assigned a single value", pr.pos(x), x.Name)
		}
	case *ast.Field:
		return pr.evalParam(d, x.Name, l, b, depth, func(arg ast.Expr, al loc, ab binding) ([]val, error) {
			return pr.eval(arg, al, ab, depth)
		})
	default:
		return nil, fmt.Errorf("%s: %s is not a constant", pr.pos(x), x.Name)
	}
	for _, e := range pr.assigns[x.Obj] {
		vals, err := pr.eval(e, l, b, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, vals...)
	}
	return out, nil
}

func (pr *Program) evalSpec(ref valueRef, l loc, b binding, depth int) ([]val, error) {
	if ref.i >= len(ref.spec.Values) {
		return nil, fmt.Errorf("%s: %s has no value of its own", pr.pos(ref.spec), ref.spec.Names[ref.i].Name)
	}
	return pr.eval(ref.spec.Values[ref.i], l, b, depth)
}

func (pr *Program) evalPkgValue(path, name string, b binding, depth int) ([]val, error) {
	if !strings.HasPrefix(path, ModulePrefix) {
		return nil, fmt.Errorf("%s.%s is outside the repository", path, name)
	}
	p, err := pr.r.load(filepath.Join(pr.r.root, strings.TrimPrefix(path, ModulePrefix)))
	if err != nil {
		return nil, err
	}
	ref, ok := p.values[name]
	if !ok {
		return nil, fmt.Errorf("%s.%s is not a constant", path, name)
	}
	return pr.evalSpec(ref, loc{p, p.fileOf[ref.spec]}, b, depth)
}

// evalParam gives the values of parameter name of the function declaring field: from the
// call b holds for that function, or else from every call of it in the program.
func (pr *Program) evalParam(field *ast.Field, name string, l loc, b binding, depth int,
	f func(arg ast.Expr, al loc, ab binding) ([]val, error)) ([]val, error) {
	fn, ok := pr.funcOf[field]
	if !ok {
		return nil, fmt.Errorf("%s: %s is not a function's parameter", pr.pos(field), name)
	}
	idx, variadic := paramIndex(fn, field, name)
	if idx < 0 || variadic {
		return nil, fmt.Errorf("%s: parameter %s cannot be followed", pr.pos(field), name)
	}
	sites := []*ast.CallExpr{b[fn]}
	if b[fn] == nil {
		sites = pr.callSites(fn)
		if len(sites) == 0 {
			if pr.usedAsValue(fn, len(sites)) {
				return nil, fmt.Errorf("%s: the function that takes %s is passed as a value, not called", pr.pos(field), name)
			}
			return nil, nil // never called in this program: what it names does not exist here
		}
	}
	var out []val
	for _, call := range sites {
		if idx >= len(call.Args) {
			return nil, fmt.Errorf("%s: call without argument %s", pr.pos(call), name)
		}
		vals, err := f(call.Args[idx], pr.locs[call], b.with(fn, call))
		if err != nil {
			return nil, err
		}
		out = append(out, vals...)
	}
	return out, nil
}

func paramIndex(fn ast.Node, field *ast.Field, name string) (int, bool) {
	var ft *ast.FuncType
	switch fn := fn.(type) {
	case *ast.FuncDecl:
		ft = fn.Type
	case *ast.FuncLit:
		ft = fn.Type
	}
	i := 0
	for _, f := range ft.Params.List {
		if len(f.Names) == 0 {
			i++
			continue
		}
		for _, n := range f.Names {
			if f == field && n.Name == name {
				_, variadic := f.Type.(*ast.Ellipsis)
				return i, variadic
			}
			i++
		}
	}
	return -1, false
}

// callSites returns the calls of fn in the program.
func (pr *Program) callSites(fn ast.Node) []*ast.CallExpr {
	var out []*ast.CallExpr
	fl := pr.locs[fn]
	for _, c := range pr.calls {
		switch fn := fn.(type) {
		case *ast.FuncLit:
			if c.Fun == fn {
				out = append(out, c)
			} else if id, ok := c.Fun.(*ast.Ident); ok && id.Obj != nil && id.Obj == pr.litObj[fn] {
				out = append(out, c)
			}
		case *ast.FuncDecl:
			cl := pr.locs[c]
			switch f := c.Fun.(type) {
			case *ast.Ident:
				if fn.Recv == nil && cl.p == fl.p && f.Name == fn.Name.Name && (f.Obj == nil || f.Obj.Decl == fn) {
					out = append(out, c)
				}
			case *ast.SelectorExpr:
				if f.Sel.Name != fn.Name.Name {
					continue
				}
				x, isIdent := f.X.(*ast.Ident)
				pkgSel := isIdent && x.Obj == nil && importPath(cl, x.Name) != ""
				switch {
				case fn.Recv == nil && pkgSel && importPath(cl, x.Name) == fl.p.path:
					out = append(out, c)
				case fn.Recv != nil && !pkgSel && (cl.p == fl.p || importsPath(cl.p, fl.p.path)) && len(c.Args) == countParams(fn.Type):
					// A method: any call of that name and arity where its package is seen.
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// usedAsValue reports whether fn is referred to other than by its calls (calls of them):
// passed or stored as a value, it may be called where this reader cannot follow.
func (pr *Program) usedAsValue(fn ast.Node, calls int) bool {
	refs := 0
	fl := pr.locs[fn]
	switch fn := fn.(type) {
	case *ast.FuncLit:
		obj := pr.litObj[fn]
		if obj == nil {
			return true
		}
		ast.Inspect(fl.f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Obj == obj && id.Pos() != obj.Pos() {
				refs++
			}
			return true
		})
	case *ast.FuncDecl:
		if fn.Recv != nil {
			return false // a method value is not followed: one with no call is taken as unused
		}
		for _, p := range pr.pkgs {
			for _, f := range p.files {
				l := loc{p, f}
				fields := map[*ast.Ident]bool{} // x.name: a field or method, or another package's
				ast.Inspect(f, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.SelectorExpr:
						fields[n.Sel] = true
						if x, ok := n.X.(*ast.Ident); ok && x.Obj == nil && importPath(l, x.Name) == fl.p.path && n.Sel.Name == fn.Name.Name {
							refs++
						}
					case *ast.Ident:
						if p == fl.p && !fields[n] && n != fn.Name && n.Name == fn.Name.Name && (n.Obj == nil || n.Obj.Decl == fn) {
							refs++
						}
					}
					return true
				})
			}
		}
	}
	return refs > calls
}

func importsPath(p *pkg, path string) bool {
	for _, imps := range p.imports {
		for _, ip := range imps {
			if ip == path {
				return true
			}
		}
	}
	return false
}

func countParams(ft *ast.FuncType) int {
	n := 0
	for _, f := range ft.Params.List {
		n += max(1, len(f.Names))
	}
	return n
}

// evalField gives the values of field of the struct base: from a keyed literal, or from
// assignments base.field = value.
func (pr *Program) evalField(base ast.Expr, field string, l loc, b binding, depth int) ([]val, error) {
	if depth > maxDepth {
		return nil, errors.New("too many steps")
	}
	depth++
	switch x := base.(type) {
	case *ast.ParenExpr:
		return pr.evalField(x.X, field, l, b, depth)
	case *ast.UnaryExpr:
		if x.Op == token.AND {
			return pr.evalField(x.X, field, l, b, depth)
		}
	case *ast.CompositeLit:
		e := keyed(x, field)
		if e == nil {
			return []val{{"", b}}, nil // the zero value
		}
		return pr.eval(e, l, b, depth)
	case *ast.Ident:
		if x.Obj == nil {
			break
		}
		if sets := pr.fieldSets[x.Obj][field]; len(sets) > 0 {
			var out []val
			for _, e := range sets {
				vals, err := pr.eval(e, l, b, depth)
				if err != nil {
					return nil, err
				}
				out = append(out, vals...)
			}
			return out, nil
		}
		switch d := x.Obj.Decl.(type) {
		case *ast.Field:
			return pr.evalParam(d, x.Name, l, b, depth, func(arg ast.Expr, al loc, ab binding) ([]val, error) {
				return pr.evalField(arg, field, al, ab, depth)
			})
		case *ast.AssignStmt:
			if i := identIndex(d.Lhs, x.Name); i >= 0 && len(d.Rhs) == len(d.Lhs) {
				return pr.evalField(d.Rhs[i], field, l, b, depth)
			}
		case *ast.ValueSpec:
			for i, n := range d.Names {
				if n.Name == x.Name && i < len(d.Values) {
					return pr.evalField(d.Values[i], field, l, b, depth)
				}
			}
		}
	}
	return nil, fmt.Errorf("%s: cannot follow the field %s", pr.pos(base), field)
}

// elems returns the elements of a slice or array literal, or of the variable holding one.
func (pr *Program) elems(x ast.Expr, l loc, depth int) ([]ast.Expr, error) {
	switch x := x.(type) {
	case *ast.CompositeLit:
		return x.Elts, nil
	case *ast.Ident:
		if x.Obj == nil {
			if ref, ok := l.p.values[x.Name]; ok && ref.i < len(ref.spec.Values) {
				return pr.elems(ref.spec.Values[ref.i], l, depth)
			}
			break
		}
		switch d := x.Obj.Decl.(type) {
		case *ast.AssignStmt:
			if i := identIndex(d.Lhs, x.Name); i >= 0 && len(d.Rhs) == len(d.Lhs) && len(pr.assigns[x.Obj]) == 0 {
				return pr.elems(d.Rhs[i], l, depth)
			}
		case *ast.ValueSpec:
			for i, n := range d.Names {
				if n.Name == x.Name && i < len(d.Values) && len(pr.assigns[x.Obj]) == 0 {
					return pr.elems(d.Values[i], l, depth)
				}
			}
		}
	}
	return nil, fmt.Errorf("%s: cannot list what is ranged over", pr.pos(x))
}

func identIndex(exprs []ast.Expr, name string) int {
	for i, e := range exprs {
		if id, ok := e.(*ast.Ident); ok && id.Name == name {
			return i
		}
	}
	return -1
}

// isRange: the parser declares a range statement's variables with a synthetic "= range x".
func isRange(e ast.Expr) bool {
	u, ok := e.(*ast.UnaryExpr)
	return ok && u.Op == token.RANGE
}

func (pr *Program) pos(n ast.Node) string {
	p := pr.r.fset.Position(n.Pos())
	if rel, err := filepath.Rel(pr.r.root, p.Filename); err == nil {
		p.Filename = filepath.ToSlash(rel)
	}
	return fmt.Sprintf("%s:%d", p.Filename, p.Line)
}
