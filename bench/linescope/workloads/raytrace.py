"""Method-heavy: a tiny ray tracer (vectors, spheres, a plane, one light) rendering a small
image. Many short methods and object allocations, like pyperformance's raytrace."""

import math

SIZE = 0  # image side; set by scale()


class Vec:
    __slots__ = ("x", "y", "z")

    def __init__(self, x, y, z):
        self.x = x
        self.y = y
        self.z = z

    def dot(self, o):
        return self.x * o.x + self.y * o.y + self.z * o.z

    def add(self, o):
        return Vec(self.x + o.x, self.y + o.y, self.z + o.z)

    def sub(self, o):
        return Vec(self.x - o.x, self.y - o.y, self.z - o.z)

    def scale(self, k):
        return Vec(self.x * k, self.y * k, self.z * k)

    def norm(self):
        return self.scale(1.0 / math.sqrt(self.dot(self)))


class Ray:
    __slots__ = ("origin", "direction")

    def __init__(self, origin, direction):
        self.origin = origin
        self.direction = direction.norm()

    def at(self, t):
        return self.origin.add(self.direction.scale(t))


class Sphere:
    def __init__(self, centre, radius, colour):
        self.centre = centre
        self.radius = radius
        self.colour = colour

    def hit(self, ray):
        oc = ray.origin.sub(self.centre)
        b = oc.dot(ray.direction)
        c = oc.dot(oc) - self.radius * self.radius
        disc = b * b - c
        if disc < 0:
            return None
        t = -b - math.sqrt(disc)
        return t if t > 1e-6 else None

    def normal(self, p):
        return p.sub(self.centre).norm()


class Plane:
    def __init__(self, point, normal_, colour):
        self.point = point
        self.n = normal_.norm()
        self.colour = colour

    def hit(self, ray):
        d = self.n.dot(ray.direction)
        if abs(d) < 1e-9:
            return None
        t = self.point.sub(ray.origin).dot(self.n) / d
        return t if t > 1e-6 else None

    def normal(self, p):
        return self.n


class Scene:
    def __init__(self):
        self.objects = [
            Sphere(Vec(0.0, 1.0, 5.0), 1.0, 0.9),
            Sphere(Vec(-1.6, 0.6, 4.0), 0.6, 0.6),
            Sphere(Vec(1.5, 0.4, 3.5), 0.4, 0.7),
            Plane(Vec(0.0, 0.0, 0.0), Vec(0.0, 1.0, 0.0), 0.5),
        ]
        self.light = Vec(-3.0, 5.0, -2.0)

    def nearest(self, ray):
        best, best_t = None, math.inf
        for obj in self.objects:
            t = obj.hit(ray)
            if t is not None and t < best_t:
                best, best_t = obj, t
        return best, best_t

    def shade(self, ray, depth):
        obj, t = self.nearest(ray)
        if obj is None:
            return 0.1
        p = ray.at(t)
        n = obj.normal(p)
        to_light = self.light.sub(p).norm()
        shadow, _ = self.nearest(Ray(p.add(n.scale(1e-4)), to_light))
        lambert = max(0.0, n.dot(to_light)) if shadow is None else 0.0
        colour = obj.colour * (0.2 + 0.8 * lambert)
        if depth > 0 and isinstance(obj, Sphere):
            refl = ray.direction.sub(n.scale(2.0 * ray.direction.dot(n)))
            colour = 0.7 * colour + 0.3 * self.shade(Ray(p.add(n.scale(1e-4)), refl), depth - 1)
        return colour


def render(size):
    scene = Scene()
    eye = Vec(0.0, 1.0, -1.0)
    total = 0.0
    for j in range(size):
        for i in range(size):
            d = Vec((i - size / 2) / size, (size / 2 - j) / size, 1.0)
            total += scene.shade(Ray(eye, d), 2)
    return total


def main():
    return render(SIZE)


def scale(factor):
    global SIZE
    SIZE = max(4, int(166 * factor ** 0.5))
