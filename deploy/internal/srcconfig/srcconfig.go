package srcconfig

import (
	"errors"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// ModulePrefix is the import path prefix of the repository's modules: an import under it
// is read from the directory of the same relative path under the repository root.
const ModulePrefix = "github.com/tokenscope/tokenscope/"

// Reader reads packages of one repository, each parsed once.
type Reader struct {
	root string
	fset *token.FileSet
	pkgs map[string]*pkg
}

type pkg struct {
	dir     string
	path    string // import path
	types   map[string]*ast.TypeSpec
	imports map[*ast.File]map[string]string // per file: local name -> import path
	fileOf  map[ast.Node]*ast.File          // type specs, package-level values and functions
	values  map[string]valueRef             // package-level constants and variables
	funcs   map[string]*ast.FuncDecl        // package-level functions (no receiver)
	files   []*ast.File
}

// valueRef is a package-level constant or variable: the spec declaring it and its index.
type valueRef struct {
	spec *ast.ValueSpec
	i    int
}

// NewReader reads packages of the repository at root.
func NewReader(root string) *Reader {
	return &Reader{root: root, fset: token.NewFileSet(), pkgs: map[string]*pkg{}}
}

func (r *Reader) load(dir string) (*pkg, error) {
	dir = filepath.Clean(dir)
	if p, ok := r.pkgs[dir]; ok {
		return p, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot read package %s: %w", dir, err)
	}
	p := &pkg{dir: dir, types: map[string]*ast.TypeSpec{}, imports: map[*ast.File]map[string]string{}, fileOf: map[ast.Node]*ast.File{},
		values: map[string]valueRef{}, funcs: map[string]*ast.FuncDecl{}}
	if rel, err := filepath.Rel(r.root, dir); err == nil {
		p.path = ModulePrefix + filepath.ToSlash(rel)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		// Object resolution ties each identifier to its declaration in the file, which
		// Program follows to find the value of a variable's name; comments hold the build
		// constraints.
		f, err := parser.ParseFile(r.fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("cannot parse %s: %w", filepath.Join(dir, name), err)
		}
		if ignored(f) {
			continue
		}
		p.files = append(p.files, f)
		imps := map[string]string{}
		for _, is := range f.Imports {
			path, _ := strconv.Unquote(is.Path.Value)
			local := path[strings.LastIndex(path, "/")+1:]
			if is.Name != nil {
				local = is.Name.Name
			}
			imps[local] = path
		}
		p.imports[f] = imps
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if fd.Recv == nil {
					p.funcs[fd.Name.Name] = fd
				}
				p.fileOf[fd] = f
				continue
			}
			gd := d.(*ast.GenDecl)
			for _, s := range gd.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.types[s.Name.Name] = s
					p.fileOf[s] = f
				case *ast.ValueSpec:
					for i, n := range s.Names {
						p.values[n.Name] = valueRef{s, i}
					}
					p.fileOf[s] = f
				}
			}
		}
	}
	if len(p.files) == 0 {
		return nil, fmt.Errorf("no Go files in %s", dir)
	}
	r.pkgs[dir] = p
	return p, nil
}

// ignored reports whether a file is kept out of every build (//go:build ignore): it is part
// of no binary.
func ignored(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if constraint.IsGoBuild(c.Text) {
				expr, err := constraint.Parse(c.Text)
				return err == nil && expr.String() == "ignore"
			}
		}
	}
	return false
}

// EnvVars returns every variable that caarlos0/env reads into the struct type typeName of
// the package in dir (relative to the root), with its envDefault ("" when none).
func (r *Reader) EnvVars(dir, typeName string) (map[string]string, error) {
	vars := map[string]string{}
	if err := r.walk(filepath.Join(r.root, dir), typeName, "", vars, 0); err != nil {
		return nil, err
	}
	if len(vars) == 0 {
		return nil, fmt.Errorf("%s.%s has no env-tagged fields", dir, typeName)
	}
	return vars, nil
}

func (r *Reader) walk(dir, typeName, prefix string, vars map[string]string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%s.%s: nesting too deep", dir, typeName)
	}
	p, err := r.load(dir)
	if err != nil {
		return err
	}
	ts, ok := p.types[typeName]
	if !ok {
		return fmt.Errorf("no type %s in %s", typeName, dir)
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return fmt.Errorf("%s.%s is not a struct", dir, typeName)
	}
	file := p.fileOf[ts]
	for _, field := range st.Fields.List {
		var tag reflect.StructTag
		if field.Tag != nil {
			s, _ := strconv.Unquote(field.Tag.Value)
			tag = reflect.StructTag(s)
		}
		if name, ok := tag.Lookup("env"); ok {
			name, _, _ = strings.Cut(name, ",")
			if name == "" || name == "-" {
				continue
			}
			vars[prefix+name] = tag.Get("envDefault")
			continue
		}
		// caarlos0/env descends into struct fields, adding envPrefix when there is one.
		subDir, subType, ok := r.structType(dir, file, p, field.Type)
		if !ok {
			continue
		}
		if err := r.walk(subDir, subType, prefix+tag.Get("envPrefix"), vars, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// structType resolves a field's type to a struct type of this repository: a type of the
// same package, or pkg.Type of a package under ModulePrefix.
func (r *Reader) structType(dir string, file *ast.File, p *pkg, expr ast.Expr) (string, string, bool) {
	if star, ok := expr.(*ast.StarExpr); ok {
		expr = star.X
	}
	switch t := expr.(type) {
	case *ast.Ident:
		if ts, ok := p.types[t.Name]; ok {
			if _, isStruct := ts.Type.(*ast.StructType); isStruct {
				return dir, t.Name, true
			}
		}
	case *ast.SelectorExpr:
		x, ok := t.X.(*ast.Ident)
		if !ok {
			return "", "", false
		}
		path, ok := p.imports[file][x.Name]
		if !ok || !strings.HasPrefix(path, ModulePrefix) {
			return "", "", false
		}
		sub := filepath.Join(r.root, strings.TrimPrefix(path, ModulePrefix))
		sp, err := r.load(sub)
		if err != nil {
			return "", "", false
		}
		if ts, ok := sp.types[t.Sel.Name]; ok {
			if _, isStruct := ts.Type.(*ast.StructType); isStruct {
				return sub, t.Sel.Name, true
			}
		}
	}
	return "", "", false
}

// flagMethods are the flag.FlagSet methods that define a flag, with the index of the
// flag's name among their arguments.
var flagMethods = map[string]int{
	"Bool": 0, "Duration": 0, "Float64": 0, "Int": 0, "Int64": 0, "String": 0, "Uint": 0, "Uint64": 0, "Func": 0, "BoolFunc": 0, "TextVar": 1,
	"BoolVar": 1, "DurationVar": 1, "Float64Var": 1, "IntVar": 1, "Int64Var": 1, "StringVar": 1, "UintVar": 1, "Uint64Var": 1, "Var": 1,
}

// Flags returns the flags that the function funcName of the package in dir (relative to
// the root) defines on the flag.FlagSet made in it with flag.NewFlagSet.
func (r *Reader) Flags(dir, funcName string) ([]string, error) {
	p, err := r.load(filepath.Join(r.root, dir))
	if err != nil {
		return nil, err
	}
	var fn *ast.FuncDecl
	for _, f := range p.files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == funcName {
				fn = fd
			}
		}
	}
	if fn == nil {
		return nil, fmt.Errorf("no function %s in %s", funcName, dir)
	}
	sets := map[string]bool{} // variables holding a FlagSet
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
			return true
		}
		if call, ok := as.Rhs[0].(*ast.CallExpr); ok && isSelector(call.Fun, "flag", "NewFlagSet") {
			if id, ok := as.Lhs[0].(*ast.Ident); ok {
				sets[id.Name] = true
			}
		}
		return true
	})
	if len(sets) == 0 {
		return nil, fmt.Errorf("%s in %s makes no flag.FlagSet", funcName, dir)
	}
	seen := map[string]bool{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		i, isDef := flagMethods[sel.Sel.Name]
		if !ok || !sets[x.Name] || !isDef || len(call.Args) <= i {
			return true
		}
		if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, _ := strconv.Unquote(lit.Value)
			seen[name] = true
		}
		return true
	})
	if len(seen) == 0 {
		return nil, errors.New(funcName + " in " + dir + " defines no flags")
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

func isSelector(e ast.Expr, pkgName, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkgName && sel.Sel.Name == name
}
