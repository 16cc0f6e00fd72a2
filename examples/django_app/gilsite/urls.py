from django.urls import path

from gilsite import views

urlpatterns = [
    path("io", views.io),
    path("cpu", views.cpu),
    path("slow_c", views.slow_c),
    path("health", views.health),
]
